r"""FLAN-style instruction tasks of the embedded corpus: items, templates and examples.

Part of the ``make_embedded_data`` generator. The ``*_items`` functions turn the records read by
``embedded_sources`` into items (one per source item, with a ``"key"`` that decides its split and
a ``"target"``); ``make_examples`` renders items with the task's ``TEMPLATES``, ~35% of them
few-shot with 1-3 solved exemplars of the same split. ``TASKS`` gives each task's sub-mixture and
example caps.
"""
from __future__ import annotations

import json
import random
import re
from typing import Any

from t5like.tools.embedded_sources import Doc, paragraphs

FEWSHOT_PROB = 0.35
Item = dict[str, str]


# ----------------------------------------------------------------------------------------------
# Text helpers.


def sentences(par: str) -> list[str]:
  return [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z\"'(])", par) if s]


def clip(text: str, limit: int) -> str:
  """Cuts at a sentence end before ``limit`` characters when there is one."""
  if len(text) <= limit:
    return text
  cut = text[:limit]
  end = max(cut.rfind(". "), cut.rfind("! "), cut.rfind("? "))
  return cut[:end + 1] if end > limit // 3 else cut.rsplit(" ", 1)[0] + " ..."


# ----------------------------------------------------------------------------------------------
# FLAN-style tasks: items (one per source item, with a "key" for the split and a "target") are
# rendered with templates; few-shot inputs prepend 1-3 solved exemplars of the same split.

OPTIONS = "OPTIONS:\n- {}"
JARGON_POS = re.compile(
    r"^(?:\d+\.\s*)?(?:\[[^\]]*\]\s*)?(?:(?:n|v|vt|vi|adj|adv|interj|excl|pref|suff|prep|pron|"
    r"conj|abbrev|obs|pl|imp)\.(?:,\s*|\s+))*")
TEMPLATES: dict[str, list[tuple[str, str]]] = {
    "wordnet_define": [
        ("noopt", 'What does the word "{word}" mean?'),
        ("noopt", 'Define the {pos} "{word}".'),
        ("noopt", "{word} ({pos})\nDefinition:"),
        ("noopt", 'Give a short dictionary definition of "{word}" as a {pos}.'),
    ],
    "wordnet_word_from_definition": [
        ("noopt", "Which {pos} means: {definition}?"),
        ("noopt", "Definition: {definition}\nWord ({pos}):"),
        ("noopt", 'Name the {pos} that is defined as "{definition}".'),
    ],
    "wordnet_use_in_sentence": [
        ("noopt", 'Use the word "{word}" in a sentence.'),
        ("noopt", 'Write a sentence using "{word}" in the sense of "{definition}".'),
        ("noopt", "{word}: {definition}\nExample sentence:"),
    ],
    "wordnet_synonyms": [
        ("noopt", 'List synonyms of the {pos} "{word}".'),
        ("noopt", 'What are other words for "{word}" ({definition})?'),
        ("noopt", "{word}\nSynonyms:"),
    ],
    "jargon_define": [
        ("noopt", 'In hacker jargon, what does "{term}" mean?'),
        ("noopt", 'Explain the hacker slang term "{term}".'),
        ("noopt", "Jargon File entry: {term}\nMeaning:"),
    ],
    "devils_dictionary_define": [
        ("noopt", "According to Ambrose Bierce's The Devil's Dictionary, what is {term}?"),
        ("noopt", 'Give a cynical definition of "{term}" ({pos}).'),
        ("noopt", "The Devil's Dictionary\n{term}, {pos}"),
    ],
    "shakespeare_which_play": [
        ("opt", "Which Shakespeare play is this passage from?\n{passage}\n{options}"),
        ("opt", "Passage:\n{passage}\nIn which of these plays does it appear?\n{options}"),
        ("noopt", "Which play by Shakespeare contains these lines?\n{passage}"),
        ("noopt", "{passage}\nName the play these lines come from."),
    ],
    "shakespeare_who_speaks": [
        ("opt", 'In {play}, who says:\n"{passage}"\n{options}'),
        ("opt", "{passage}\nWhich character of {play} speaks these lines?\n{options}"),
        ("noopt", "Which character in {play} speaks these lines?\n{passage}"),
    ],
    "shakespeare_continue": [
        ("noopt", "Continue this passage from {play}:\n{passage}"),
        ("noopt", "{passage}\nWhat comes next in this speech by {speaker}?"),
        ("noopt", "Complete the lines of {speaker} in {play}.\n{passage}"),
    ],
    "wiki_which_article": [
        ("opt", "Which encyclopedia article is this paragraph from?\n{passage}\n{options}"),
        ("opt", "{passage}\nWhat is the topic (shown as ____) of this text?\n{options}"),
        ("noopt", "Read the paragraph and name its topic (hidden as ____).\n{passage}"),
    ],
    "wiki_continue": [
        ("noopt", "Continue the text.\n{passage}"),
        ("noopt", "From the article \"{title}\":\n{passage}\nWhat is the next sentence?"),
        ("noopt", "{passage}\nWrite the sentence that follows."),
    ],
}
TASKS = {  # task -> (sub-mixture, train cap, validation cap)
    "wordnet_define": ("definitions", 20000, 600),
    "wordnet_word_from_definition": ("definitions", 5000, 300),
    "wordnet_use_in_sentence": ("definitions", 3000, 200),
    "wordnet_synonyms": ("definitions", 3000, 200),
    "jargon_define": ("definitions", 2000, 150),
    "devils_dictionary_define": ("definitions", 1000, 100),
    "shakespeare_which_play": ("shakespeare_qa", 8000, 400),
    "shakespeare_who_speaks": ("shakespeare_qa", 4000, 300),
    "shakespeare_continue": ("shakespeare_qa", 3000, 200),
    "wiki_which_article": ("encyclopedia", 1000, 100),
    "wiki_continue": ("encyclopedia", 2000, 150),
}


def sentence_case(text: str, end: str = ".") -> str:
  text = text.strip()
  text = text[:1].upper() + text[1:]
  return text if text[-1:] in ".!?\"')" else text + end


def mc_item(rng: random.Random, answer: str, pool: list[str], **fields: str) -> Item:
  options = [answer] + rng.sample(sorted(set(pool) - {answer}), 3)
  rng.shuffle(options)
  return {"target": answer, "options": OPTIONS.format("\n- ".join(options)), **fields}


def wordnet_items(records: list[dict[str, Any]]) -> dict[str, list[Item]]:
  out: dict[str, list[Item]] = {k: [] for k in TEMPLATES if k.startswith("wordnet_")}
  for r in records:
    word, key = r["lemma"], "wordnet:" + r["lemma"].lower()
    base = {"key": key, "word": word, "pos": r["pos"], "definition": r["definition"]}
    out["wordnet_define"].append({**base, "target": sentence_case(r["definition"])})
    if r["words"][0].lower() == word.lower():
      out["wordnet_word_from_definition"].append({**base, "target": word})
    pattern = re.compile(rf"\b{re.escape(word)}\b", re.I)
    examples = [e for e in r["examples"] if pattern.search(e) and len(e.split()) >= 4]
    if examples:
      out["wordnet_use_in_sentence"].append({**base, "target": sentence_case(examples[0])})
    others = [w for w in dict.fromkeys(r["words"]) if w.lower() != word.lower()]
    if others:
      out["wordnet_synonyms"].append({**base, "target": ", ".join(others[:6])})
  return out


def dictionary_items(jargon: list[dict[str, Any]], devil: list[dict[str, str]]
                     ) -> dict[str, list[Item]]:
  out: dict[str, list[Item]] = {"jargon_define": [], "devils_dictionary_define": []}
  for e in jargon:
    pars = [p for p in e["pars"] if not re.fullmatch(r"\[[^\]]*\]", p)]
    definition = JARGON_POS.sub("", pars[0]).strip() if pars else ""
    if len(definition) >= 20:
      out["jargon_define"].append({"key": "jargon_file:" + e["term"], "term": e["term"],
                                   "target": sentence_case(clip(definition, 500))})
  for e in devil:
    term = e["term"].lower() if e["term"].isupper() else e["term"]
    out["devils_dictionary_define"].append({
        "key": "devils_dictionary:" + e["term"], "term": term, "pos": e["pos"] or "n.",
        "target": sentence_case(clip(e["definition"], 500))})
  return out


def shakespeare_items(scenes: list[dict[str, Any]], seed: int) -> dict[str, list[Item]]:
  rng = random.Random(f"{seed}:shakespeare")
  plays = sorted({s["play"] for s in scenes})
  counts: dict[str, dict[str, int]] = {p: {} for p in plays}
  for s in scenes:
    for who, _ in s["speeches"]:
      if who:
        counts[s["play"]][who] = counts[s["play"]].get(who, 0) + 1
  top = {p: sorted(c, key=lambda w: (-c[w], w))[:12] for p, c in counts.items()}
  out: dict[str, list[Item]] = {"shakespeare_which_play": [], "shakespeare_who_speaks": [],
                                "shakespeare_continue": []}
  for s in scenes:
    for who, lines in s["speeches"]:
      base = {"key": s["key"], "play": s["play"], "speaker": who or ""}
      if len(lines) >= 3:
        passage = "\n".join(lines[:4])
        out["shakespeare_which_play"].append(
            mc_item(rng, s["play"], plays, **base, passage=passage))
      if who in top[s["play"]] and len(lines) >= 2 and len(top[s["play"]]) >= 4:
        out["shakespeare_who_speaks"].append(
            mc_item(rng, who, top[s["play"]], **base, passage="\n".join(lines[:4])))
      if who and len(lines) >= 5:
        n = rng.randint(2, 4)
        out["shakespeare_continue"].append({**base, "passage": "\n".join(lines[:n]),
                                            "target": "\n".join(lines[n:n + 2])})
  return out


def wiki_items(docs: list[Doc], seed: int) -> dict[str, list[Item]]:
  rng = random.Random(f"{seed}:wiki")
  titles = sorted(d["meta"]["title"] for d in docs)
  out: dict[str, list[Item]] = {"wiki_which_article": [], "wiki_continue": []}
  for d in docs:
    title = d["meta"]["title"]
    good = [p for p in paragraphs(d["text"]) if len(p) >= 250 and len(sentences(p)) >= 3]
    for i, par in enumerate(good):
      sents = sentences(par)
      base = {"key": d["key"], "title": title}
      out["wiki_continue"].append({**base, "passage": " ".join(sents[:2]), "target": sents[2]})
      masked = re.sub(re.escape(re.sub(r"\s*\(.*\)$", "", title)), "____", clip(par, 600),
                      flags=re.I)
      if i < 4 and "____" in masked:
        out["wiki_which_article"].append(mc_item(rng, title, titles, **base, passage=masked))
  return out


def render(template: str, item: Item) -> str:
  return re.sub(r"\n{2,}", "\n", template.format(**item)).strip()


def make_examples(task: str, items: list[Item], cap: int, seed: int, split: str
                  ) -> list[dict[str, str]]:
  """Renders up to ``cap`` examples; ~35% few-shot with 1-3 exemplars from the same split."""
  rng = random.Random(f"{seed}:{task}:{split}")
  pool = sorted(items, key=lambda it: json.dumps(it, sort_keys=True))
  rng.shuffle(pool)
  submixture, examples = TASKS[task][0], []
  for i, item in enumerate(pool[:cap]):
    kind, template = rng.choice(TEMPLATES[task])
    shots = rng.randint(1, 3) if rng.random() < FEWSHOT_PROB and len(pool) > 8 else 0
    others = [j for j in rng.sample(range(len(pool)), shots + 1) if j != i][:shots]
    parts = [render(template, pool[j]) + "\n" + pool[j]["target"] for j in others]
    parts.append(render(template, item))
    examples.append({"inputs": "\n\n".join(parts), "targets": item["target"].strip(),
                     "task_name": task, "task_source": submixture,
                     "template_type": f"{'fs' if shots else 'zs'}_{kind}"})
  return examples

