r"""Trains a SentencePiece vocabulary (T5 ids) from jsonl / jsonl.zst / jsonl.gz / txt files.

  python -m t5like.tools.build_vocab \
    --input 'data/redpajama/*/*.jsonl.zst' --field text \
    --vocab_size 32768 --output_prefix /path/spm

``--input`` may be repeated; ``--field`` is a comma-separated list of record fields to read (those
present in a record are used: ``text`` for RedPajama, ``inputs,targets`` for FLAN). Each field is
split into lines; at most ``--max_sentences`` lines and ``--max_characters`` characters are kept by
seeded reservoir sampling, so the same files and seed give the same model.
"""
from __future__ import annotations

import argparse
import glob
import gzip
import io
import json
import pathlib
import random
import sys
from typing import IO, Iterator, Sequence

from t5like.data import vocab as vocab_lib


class NoInputError(FileNotFoundError):
  """An --input pattern matched no file."""


def expand_inputs(patterns: Sequence[str]) -> list[str]:
  """Expands each glob (sorted); raises NoInputError naming any pattern that matches nothing."""
  files = []
  for pattern in patterns:
    matches = sorted(glob.glob(pattern, recursive=True))
    if not matches:
      raise NoInputError(f"build_vocab: no file matches --input pattern {pattern!r}")
    files.extend(matches)
  return list(dict.fromkeys(files))


def _open_text(path: str) -> IO[str]:
  if path.endswith(".zst"):
    import zstandard  # pylint: disable=g-import-not-at-top
    reader = zstandard.ZstdDecompressor().stream_reader(open(path, "rb"))
    return io.TextIOWrapper(reader, encoding="utf-8")
  if path.endswith(".gz"):
    return gzip.open(path, "rt", encoding="utf-8")
  return open(path, encoding="utf-8")


def iter_texts(files: Sequence[str], fields: Sequence[str]) -> Iterator[str]:
  """Yields the requested fields of every json record (or every line of plain-text files)."""
  for path in files:
    is_json = ".jsonl" in path or path.endswith((".json", ".json.zst", ".json.gz"))
    with _open_text(path) as f:
      for line in f:
        if not line.strip():
          continue
        if not is_json:
          yield line
          continue
        record = json.loads(line)
        for field in fields:
          value = record.get(field)
          if isinstance(value, str) and value:
            yield value


def sample_lines(texts: Iterator[str], max_sentences: int, max_characters: int,
                 seed: int) -> list[str]:
  """Reservoir-samples non-empty lines, then trims to ``max_characters`` in total."""
  rng = random.Random(seed)
  reservoir: list[str] = []
  seen = 0
  for text in texts:
    for line in text.splitlines():
      line = line.strip()
      if not line:
        continue
      seen += 1
      if len(reservoir) < max_sentences:
        reservoir.append(line)
      else:
        j = rng.randrange(seen)
        if j < max_sentences:
          reservoir[j] = line
  out, total = [], 0
  for line in reservoir:
    if total + len(line) > max_characters:
      break
    out.append(line)
    total += len(line)
  return out


def build_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--input", action="append", required=True,
                 help="glob of .jsonl[.zst|.gz] or .txt files (repeatable)")
  p.add_argument("--field", default="text", help="comma-separated json fields to read")
  p.add_argument("--vocab_size", type=int, default=32768)
  p.add_argument("--output_prefix", required=True, help="writes <prefix>.model and .vocab")
  p.add_argument("--max_sentences", type=int, default=2_000_000)
  p.add_argument("--max_characters", type=int, default=500_000_000)
  p.add_argument("--character_coverage", type=float, default=0.9995)
  p.add_argument("--model_type", default="unigram", choices=("unigram", "bpe"))
  p.add_argument("--hard_vocab_limit", action=argparse.BooleanOptionalAction, default=True,
                 help="--no-hard_vocab_limit lets small corpora yield fewer pieces")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--verbose", action="store_true")
  return p


def main(argv: Sequence[str] | None = None) -> pathlib.Path:
  args = build_parser().parse_args(argv)
  try:
    files = expand_inputs(args.input)
  except NoInputError as e:
    raise SystemExit(str(e)) from None
  fields = [f.strip() for f in args.field.split(",") if f.strip()]
  lines = sample_lines(iter_texts(files, fields), args.max_sentences, args.max_characters,
                       args.seed)
  if not lines:
    raise SystemExit(f"build_vocab: no text in fields {fields} of {len(files)} file(s)")
  print(f"build_vocab: {len(files)} files, {len(lines)} lines, "
        f"{sum(map(len, lines))} characters -> vocab_size {args.vocab_size}", file=sys.stderr)
  model = vocab_lib.train_sentencepiece(
      iter(lines), args.output_prefix, args.vocab_size, model_type=args.model_type,
      character_coverage=args.character_coverage, hard_vocab_limit=args.hard_vocab_limit,
      verbose=args.verbose)
  print(model)
  return model


if __name__ == "__main__":
  main()
