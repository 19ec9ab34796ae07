r"""Packed tokens/s of the data pipeline per feature converter, printed as a table.

Reads the embedded corpora (or ``--data_dir`` / ``--flan_dir`` in RedPajama / FLAN layout) through
the same `t5like.data.pipeline.make_iterator` the trainer uses, on this machine's CPUs:

  python benchmarks/data_throughput.py                       # paper lengths, batch 8, jsonl
  python benchmarks/data_throughput.py --source tfds --batches 50

Columns: converter (and the objective feeding it), rows/s, packed tokens/s (non-padding tokens,
encoder + decoder), target tokens/s (tokens with loss weight 1), fill (non-padding share of the row
cells), and the time to the first batch (pipeline build + shuffle buffers). Steady-state figures
are over ``--batches`` after ``--warmup`` batches.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# pylint: disable-next=wrong-import-position
from t5like.config import Config, apply_overrides

# (row label, overrides): the paper's lengths (PAPER.md §1 "Training").
CASES = (
    ("Decoder (LM), DecLLM causal LM", "redpajama",
     ["model.family=decllm", "data.sequence_length=2048"]),
    ("PrefixLM, DecLLM prefix LM", "redpajama",
     ["model.family=decllm", "model.decoder_attention=prefix", "data.inputs_length=1024",
      "data.targets_length=1024"]),
    ("EncDec, RedLLM prefix LM", "redpajama",
     ["model.family=redllm", "data.inputs_length=1024", "data.targets_length=1024"]),
    ("PrefixLM, DecLLM instruction", "flan",
     ["model.family=decllm", "data.inputs_length=2048", "data.targets_length=512"]),
    ("EncDec, RedLLM instruction", "flan",
     ["model.family=redllm", "data.inputs_length=2048", "data.targets_length=512"]),
)


def measure(cfg: Config, batch_size: int, warmup: int, batches: int) -> dict[str, float]:
  from t5like.data import pipeline  # pylint: disable=g-import-not-at-top

  start = time.perf_counter()
  it = pipeline.make_iterator(cfg, batch_size=batch_size)
  next(it)
  first = time.perf_counter() - start
  for _ in range(warmup):
    next(it)
  packed = targets = cells = 0
  start = time.perf_counter()
  for _ in range(batches):
    b = next(it)
    for key in ("encoder_segment_ids", "decoder_segment_ids"):
      if key in b:
        packed += int((b[key] > 0).sum())
        cells += b[key].size
    targets += int(b["decoder_loss_weights"].sum())
  secs = time.perf_counter() - start
  it.close()
  return {"rows/s": batches * batch_size / secs, "packed tok/s": packed / secs,
          "target tok/s": targets / secs, "fill": packed / max(cells, 1), "first batch s": first}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--batch_size", type=int, default=8)
  parser.add_argument("--warmup", type=int, default=50)
  parser.add_argument("--batches", type=int, default=200)
  parser.add_argument("--shuffle_buffer_size", type=int, default=128,
                      help="per-task buffer; keep it small so warm-up drains what the first "
                      "batch pre-filled and the timing is the steady state")
  parser.add_argument("--source", choices=("jsonl", "tfds"), default="jsonl")
  parser.add_argument("--data_dir", default="", help="RedPajama-V1 layout root (default: embedded)")
  parser.add_argument("--flan_dir", default="", help="FLAN layout root (default: embedded)")
  parser.add_argument("--only", default="", help="run the rows whose label contains this text")
  args = parser.parse_args(argv)

  rows = []
  for label, corpus, overrides in CASES:
    if args.only and args.only not in label:
      continue
    cfg = Config()
    data_dir = args.data_dir if corpus == "redpajama" else args.flan_dir
    name = ("redpajama_v1" if corpus == "redpajama" else "flan") if data_dir else (
        f"embedded_{corpus}")
    apply_overrides(cfg, overrides + [f"data.mixture={name}", f"data.data_dir={data_dir}",
                                      f"data.source={args.source}",
                                      f"data.shuffle_buffer_size={args.shuffle_buffer_size}"])
    rows.append((label, measure(cfg.validate(), args.batch_size, args.warmup, args.batches)))

  cols = ("rows/s", "packed tok/s", "target tok/s", "fill", "first batch s")
  width = max(len(label) for label, _ in rows) if rows else 10
  print(f"\nbatch {args.batch_size}, {args.batches} batches after {args.warmup} warm-up, "
        f"shuffle buffer {args.shuffle_buffer_size}, source {args.source}, "
        f"{os.cpu_count()} CPUs")
  print(f"| {'converter, objective':<{width}} | " + " | ".join(f"{c:>13}" for c in cols) + " |")
  print(f"|{'-' * (width + 2)}|" + "|".join("-" * 15 for _ in cols) + "|")
  for label, r in rows:
    cells = [f"{r[c]:>13,.0f}" if c.endswith("/s") else f"{r[c]:>13.2f}" for c in cols]
    print(f"| {label:<{width}} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
  main()
