r"""Trains a SentencePiece vocabulary (T5 ids) on a sample of a corpus; writes it to a path or bucket.

The paper's 32,768-piece model from a RedPajama-V1 root (or a FLAN root with ``--corpus flan``):

  python -m t5like.tools.build_vocab --data_dir gs://bucket/redpajama_v1 --corpus redpajama \
    --vocab_size 32768 --output_prefix gs://bucket/vocab/spm

then train with ``--config.data.vocab_path=gs://bucket/vocab/spm.model`` (the run's config.json
records it). The model: unigram, byte fallback (any UTF-8 round-trips), T5 ids pad=0, eos=1, unk=2,
no BOS, ``nmt_nfkc`` normalisation (`t5like.data.vocab.train_sentencepiece`).

Span corruption / UL2 need sentinel ids: ``--extra_ids 100`` (T5) trains ``vocab_size - 100``
pieces; seqio appends the 100 ids above them (``data.extra_ids``), so ``model.vocab_size`` stays
``--vocab_size``. ``<output_prefix>.json`` records ``extra_ids`` and the run's start-up check
refuses a ``data.extra_ids`` that differs from it.

Sampling with ``--data_dir``: a budget of ``--max_characters`` split over the parts by rate
(RedPajama subsets: the paper's token counts, as the training mixture; ``--rates`` overrides, e.g.
'{"github": 0}'; FLAN: equal per task). Each part reads up to ``--docs_per_shard`` documents from
each of its shards in a seeded random order until its budget is spent, so a terabyte corpus costs
only the sample. ``<output_prefix>.json`` records the sample (characters per part, files read).

Or from explicit files: ``--input 'data/*/*.jsonl.zst' --field text`` (repeatable; ``--field`` is
a comma-separated list of record fields, ``inputs,targets`` for FLAN); at most ``--max_sentences``
lines and ``--max_characters`` characters are kept by seeded reservoir sampling. Same files and
seed, same model.
"""
from __future__ import annotations

import argparse
import gzip
import io
import json
import pathlib
import random
import sys
import tempfile
from typing import IO, Iterator, Sequence

from etils import epy

from t5like import cli, runtime
from t5like.data import sources
from t5like.data import vocab as vocab_lib
from t5like.errors import UserError

with epy.lazy_imports():  # Loaded by main() under runtime's filter (no start-up chatter).
  import tensorflow as tf  # pylint: disable=g-import-not-at-top


class NoInputError(UserError, FileNotFoundError):
  """An --input pattern matched no file."""


def expand_inputs(patterns: Sequence[str]) -> list[str]:
  """Expands each glob (sorted); raises NoInputError naming any pattern that matches nothing."""
  files = []
  for pattern in patterns:
    matches = sorted(tf.io.gfile.glob(pattern))
    if not matches:
      raise NoInputError(f"build_vocab: no file matches --input pattern {pattern!r}")
    files.extend(matches)
  return list(dict.fromkeys(files))


def _open_text(path: str) -> IO[str]:
  raw = tf.io.gfile.GFile(path, "rb")  # Local paths and gs:// alike.
  if path.endswith(".zst"):
    import zstandard  # pylint: disable=g-import-not-at-top
    reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    return io.TextIOWrapper(reader, encoding="utf-8")
  if path.endswith(".gz"):
    return io.TextIOWrapper(gzip.GzipFile(fileobj=raw), encoding="utf-8")
  return io.TextIOWrapper(raw, encoding="utf-8")


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


def corpus_parts(data_dir: str, corpus: str, rates: dict[str, float]
                 ) -> dict[str, tuple[float, list[str], tuple[str, ...]]]:
  """part -> (rate, shards, fields) of a RedPajama-V1 or FLAN root."""
  if corpus == "redpajama":
    subsets = sources.redpajama_subsets(data_dir)
    unknown = sorted(set(rates) - set(subsets))
    if unknown:
      raise SystemExit(f"build_vocab: --rates names {unknown} not present under {data_dir} "
                       f"(subsets: {sorted(subsets)})")
    return {s: (rates.get(s, sources.REDPAJAMA_TOKENS_B[s]), files, ("text",))
            for s, files in subsets.items()}
  return {f"{t.submixture}/{t.task}": (rates.get(t.task, 1.0), [p for s, p in t.splits
                                                                 if s == "train"],
                                       ("inputs", "targets"))
          for t in sources.flan_tasks(data_dir)}


def sample_corpus(data_dir: str, corpus: str, *, max_characters: int, docs_per_shard: int,
                  seed: int, rates: dict[str, float] | None = None
                  ) -> tuple[list[str], dict[str, dict[str, int]]]:
  """Lines sampled from each part up to its share of ``max_characters``; and what was read."""
  parts = corpus_parts(data_dir, corpus, rates or {})
  total = sum(r for r, _, _ in parts.values())
  if total <= 0:
    raise SystemExit(f"build_vocab: every part of {data_dir} has rate 0")
  rng = random.Random(seed)
  lines, report = [], {}
  for name, (rate, files, fields) in sorted(parts.items()):
    budget = int(max_characters * rate / total)
    order = list(files)
    rng.shuffle(order)
    chars = used = 0
    for path in order:
      if chars >= budget:
        break
      used += 1
      for n, text in enumerate(iter_texts([path], fields)):
        if n >= docs_per_shard or chars >= budget:
          break
        for line in text.splitlines():
          line = line.strip()[:budget - chars]
          if line:
            lines.append(line)
            chars += len(line)
    report[name] = {"characters": chars, "budget": budget, "files_read": used,
                    "files": len(files)}
  rng.shuffle(lines)
  return lines, report


def _write_outputs(model_bytes_path: pathlib.Path, output_prefix: str, record: dict) -> str:
  """Copies ``<tmp>.model/.vocab`` to ``output_prefix`` (a path or bucket) plus a JSON record."""
  tf.io.gfile.makedirs(output_prefix.rsplit("/", 1)[0] if "/" in output_prefix else ".")
  for ext in (".model", ".vocab"):
    tf.io.gfile.copy(str(model_bytes_path.with_suffix(ext)), output_prefix + ext, overwrite=True)
  with tf.io.gfile.GFile(output_prefix + ".json", "w") as f:
    json.dump(record, f, indent=2, sort_keys=True)
  return output_prefix + ".model"


def build_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--input", action="append", default=[],
                 help="glob of .jsonl[.zst|.gz] or .txt files, local or gs:// (repeatable)")
  p.add_argument("--data_dir", default="", help="corpus root to sample (instead of --input)")
  p.add_argument("--corpus", default="redpajama", choices=("redpajama", "flan"),
                 help="layout of --data_dir")
  p.add_argument("--rates", default="{}", help="JSON rate overrides by subset / task name")
  p.add_argument("--docs_per_shard", type=int, default=200,
                 help="--data_dir: documents read per shard at most (spreads the sample)")
  p.add_argument("--field", default="text", help="comma-separated json fields to read")
  p.add_argument("--vocab_size", type=int, default=32768,
                 help="ids in all: SentencePiece pieces + --extra_ids (= model.vocab_size)")
  p.add_argument("--extra_ids", type=int, default=0,
                 help="sentinel ids reserved at the top for span corruption / UL2 (T5: 100); "
                      "the model gets vocab_size - extra_ids pieces and seqio appends the rest")
  p.add_argument("--output_prefix", required=True,
                 help="writes <prefix>.model, .vocab and .json (local path or gs://)")
  p.add_argument("--max_sentences", type=int, default=2_000_000)
  p.add_argument("--max_characters", type=int, default=500_000_000)
  p.add_argument("--character_coverage", type=float, default=0.9995)
  p.add_argument("--model_type", default="unigram", choices=("unigram", "bpe"))
  p.add_argument("--hard_vocab_limit", action=argparse.BooleanOptionalAction, default=True,
                 help="--no-hard_vocab_limit lets small corpora yield fewer pieces")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--verbose", action="store_true")
  return p


def main(argv: Sequence[str] | None = None) -> str | pathlib.Path:
  parser = build_parser()
  cli.add_debug_argument(parser)
  args = parser.parse_args(argv)
  runtime.init_tensorflow()
  if bool(args.input) == bool(args.data_dir):
    raise SystemExit("build_vocab: give either --input globs or --data_dir (a corpus root)")
  if not 0 <= args.extra_ids < args.vocab_size - 259:
    raise SystemExit(f"build_vocab: --extra_ids={args.extra_ids} must be >= 0 and leave room for "
                     f"the 259 special and byte pieces in --vocab_size={args.vocab_size}")
  pieces = args.vocab_size - args.extra_ids
  record = {"vocab_size": args.vocab_size, "pieces": pieces, "extra_ids": args.extra_ids,
            "model_type": args.model_type, "byte_fallback": True,
            "ids": {"pad": vocab_lib.PAD_ID, "eos": vocab_lib.EOS_ID, "unk": vocab_lib.UNK_ID,
                    "bos": None}, "normalization": "nmt_nfkc", "seed": args.seed,
            "character_coverage": args.character_coverage}
  if args.data_dir:
    try:
      lines, report = sample_corpus(args.data_dir, args.corpus,
                                    max_characters=args.max_characters,
                                    docs_per_shard=args.docs_per_shard, seed=args.seed,
                                    rates=json.loads(args.rates))
    except sources.LayoutError as e:
      raise SystemExit(f"build_vocab: {e}") from None
    lines = lines[:args.max_sentences]
    record.update({"data_dir": args.data_dir, "corpus": args.corpus, "sample": report})
    what = f"{args.data_dir} ({args.corpus})"
  else:
    try:
      files = expand_inputs(args.input)
    except NoInputError as e:
      raise SystemExit(str(e)) from None
    fields = [f.strip() for f in args.field.split(",") if f.strip()]
    lines = sample_lines(iter_texts(files, fields), args.max_sentences, args.max_characters,
                         args.seed)
    record.update({"inputs": args.input, "fields": fields, "files": len(files)})
    what = f"{len(files)} files, fields {fields}"
  if not lines:
    raise SystemExit(f"build_vocab: no text in {what}")
  record["sample_lines"], record["sample_characters"] = len(lines), sum(map(len, lines))
  print(f"build_vocab: {what}: {len(lines)} lines, {record['sample_characters']} characters -> "
        f"{pieces} pieces + {args.extra_ids} sentinel ids", file=sys.stderr)
  with tempfile.TemporaryDirectory() as tmp:
    model = vocab_lib.train_sentencepiece(
        iter(lines), pathlib.Path(tmp) / "spm", pieces, model_type=args.model_type,
        character_coverage=args.character_coverage, hard_vocab_limit=args.hard_vocab_limit,
        verbose=args.verbose)
    out = _write_outputs(model, args.output_prefix, record)
  print(out)
  print(f"train with: --config.data.vocab_path={out}"
        + (f" --config.data.extra_ids={args.extra_ids} --config.model.vocab_size="
           f"{args.vocab_size}" if args.extra_ids else ""), file=sys.stderr)
  return pathlib.Path(out) if "://" not in out else out


if __name__ == "__main__":
  sys.exit(cli.guard(main))
