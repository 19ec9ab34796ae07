"""Helpers shared by the data tests: fixture vocabulary words and a jsonl(.zst) writer."""
from __future__ import annotations

import io
import json
import pathlib
import random

import zstandard

WORDS = ("the of and to in is was for on that with as by at from his her it an were which be "
         "this are or had not but one all their there been have has who they its first also new "
         "time after two may other more years into only over most such some would when than "
         "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima").split()
MARKERS = {"arxiv": "alpha", "book": "bravo", "wikipedia": "charlie"}


def write_jsonl(path: pathlib.Path, records, *, zst: bool = False, raw_lines=()) -> pathlib.Path:
  """Writes records (dicts) and raw byte lines to ``path`` (zstd-compressed if ``zst``)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  buf = io.BytesIO()
  for r in records:
    buf.write(json.dumps(r).encode() + b"\n")
  for line in raw_lines:
    buf.write(line + b"\n")
  data = buf.getvalue()
  path.write_bytes(zstandard.ZstdCompressor().compress(data) if zst else data)
  return path


def make_doc(rng: random.Random, marker: str, n_words: int) -> str:
  words = [rng.choice(WORDS[:40]) for _ in range(n_words)]
  for i in range(0, n_words, 3):
    words[i] = marker
  return " ".join(words)


# (submixture, task) -> train examples of the FLAN fixture.
FLAN_SIZES = {("sub_a", "define"): 60, ("sub_a", "continue"): 30, ("sub_b", "qa"): 10}
