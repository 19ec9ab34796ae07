r"""Packed tokens/s of the data pipeline at paper lengths, per source and objective, and the CPU
cores a host needs to feed its chips; cold start and mid-epoch resume times.

  python benchmarks/data_throughput.py                          # generated paper-shaped corpus
  python benchmarks/data_throughput.py --sources jsonl,tfds --batches 100
  python benchmarks/data_throughput.py --embedded               # the embedded corpora instead
  python benchmarks/data_throughput.py --sources jsonl,cache     # from a cache beside on the fly
  python benchmarks/data_throughput.py --smoke                   # a few batches: does it run

The corpus is generated once into ``--corpus_dir`` by `t5like.tools.make_paper_corpus` (7
RedPajama subsets with hundreds of shards, ``--flan_tasks`` FLAN tasks of 10-10,000 examples,
``.jsonl.zst``); ``tfds`` rows convert it once (in this process) into ``<corpus_dir>/tfds``;
``cache`` rows read the seqio cache of `t5like.tools.cache_data` (``data.cache_dir``), built
once into ``<corpus_dir>/cache`` (on Beam's DirectRunner when apache-beam is installed, else
file by file here), and so compare tokens/s per host from the cache with tokenising on the fly
for the same mixtures in one run. Every row reads through `t5like.data.pipeline.make_iterator`, as training
does, with the data settings of the paper presets (`t5like.config.presets`: stream chunking,
RedLLM 1024+1024, FLAN 2048+512 with one pipeline per sub-mixture and counts from the cache next
to the data) and the embedded 8,192-piece vocabulary. ``--flan_grouping task`` measures FLAN with
one pipeline per task instead (minutes to build and ~15 MB of host memory per task).

Columns: packed tokens/s (non-padding encoder + decoder tokens) in wall time, and per CPU-second
of this process (user + system time: the rate one core sustains, whatever else runs on the
machine); fill (non-padding share of row cells); cold start (build + first batch); resume (a new
iterator restored from a checkpoint taken mid-epoch, to its first batch); RSS (this process's
resident memory after the row, both of its iterators open). The cores table divides
a host's demand by the per-core rate: the 150M model needs ~1.1 GFLOP per training token, so a
v5p chip (459 TFLOP/s bf16) at 55% MFU eats ~230k tokens/s and a 4-chip host ~0.92M.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # A checkout.

# pylint: disable=wrong-import-position
from t5like.config import Config, presets
from t5like.data import vocab

CHIP_TOKENS_PER_S = 459e12 * 0.55 / 1.1e9  # v5p bf16 peak x 55% MFU / FLOP per token (150M).
CHIPS_PER_HOST = 4

# (label, corpus, preset): rows read with the data settings of the paper preset (150M size).
CASES = (
    ("DecLLM causal 2048", "redpajama", lambda: presets.paper_pretraining("decllm", "150m")),
    ("RedLLM prefix 1024+1024", "redpajama", lambda: presets.paper_pretraining("redllm", "150m")),
    ("DecLLM instruction 2048+512", "flan",
     lambda: presets.paper_instruction_tuning("decllm", "150m")),
    ("RedLLM instruction 2048+512", "flan",
     lambda: presets.paper_instruction_tuning("redllm", "150m")),
)


def _rss_gib() -> float:
  """Resident memory of this process now (Linux), in GiB."""
  try:
    with open("/proc/self/statm") as f:
      return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
  except OSError:
    return float("nan")


def _cpu() -> float:
  t = os.times()
  return t.user + t.system


def _count(b) -> tuple[int, int]:
  packed = cells = 0
  for key in ("encoder_segment_ids", "decoder_segment_ids"):
    if key in b:
      packed += int((b[key] > 0).sum())
      cells += b[key].size
  return packed, cells


def measure(cfg: Config, batch_size: int, warmup: int, batches: int) -> dict[str, float]:
  from t5like.data import pipeline  # pylint: disable=g-import-not-at-top

  start = time.perf_counter()
  it = pipeline.make_iterator(cfg, batch_size=batch_size)
  next(it)
  cold = time.perf_counter() - start
  for _ in range(warmup):
    next(it)
  packed = cells = 0
  start, cpu = time.perf_counter(), _cpu()
  for _ in range(batches):
    p, c = _count(next(it))
    packed, cells = packed + p, cells + c
  secs, cpu_secs = time.perf_counter() - start, _cpu() - cpu
  with tempfile.TemporaryDirectory() as tmp:  # Resume mid-epoch from a saved position.
    it.save(tmp)
    expected = next(it)
    it.close()
    start = time.perf_counter()
    again = pipeline.make_iterator(cfg, batch_size=batch_size)
    again.restore(tmp)
    got = next(again)
    resume = time.perf_counter() - start
    rss = _rss_gib()
    again.close()
  assert all((expected[k] == got[k]).all() for k in expected), "resume gave other batches"
  return {"packed tok/s": packed / secs, "tok/CPU-s": packed / max(cpu_secs, 1e-9),
          "fill": packed / max(cells, 1), "cold start s": cold, "resume s": resume,
          "RSS GiB": rss}


def _prepare(corpus_dir: str, args) -> None:
  from t5like.tools import make_paper_corpus, prepare_data  # pylint: disable=g-import-not-at-top

  if not os.path.isdir(os.path.join(corpus_dir, "flan")):
    t = time.time()
    make_paper_corpus.main(["--out", corpus_dir, "--scale", str(args.scale),
                            "--flan_tasks", str(args.flan_tasks)])
    print(f"generated {corpus_dir} in {time.time() - t:.0f}s", file=sys.stderr)
  t = time.time()
  prepare_data.main(["--data_dir", os.path.join(corpus_dir, "flan"), "--corpus", "flan"])
  print(f"FLAN counts ready in {time.time() - t:.1f}s", file=sys.stderr)
  if "tfds" in args.sources:
    from t5like.data import tfds_builder  # pylint: disable=g-import-not-at-top
    tfds_dir = os.path.join(corpus_dir, "tfds")
    tfds_builder.prepare_redpajama(os.path.join(corpus_dir, "redpajama"), tfds_dir)
    tfds_builder.prepare_flan(os.path.join(corpus_dir, "flan"), tfds_dir)


def _cache(cfg: Config, cache_dir: str, built: set) -> None:
  """Builds the cache of ``cfg``'s corpus into ``cache_dir`` once (Beam if installed)."""
  from t5like.data import caching, tasks  # pylint: disable=g-import-not-at-top

  d = cfg.data
  corpus = d.mixture.split(".")[0].split(":")[0]
  if corpus in built:
    return
  overrides = [f"data.vocab_path={d.vocab_path}", f"data.flan_grouping={d.flan_grouping}",
               f"data.flan_example_cap={d.flan_example_cap}"]
  spec = tasks.cache_spec({"redpajama_v1": "redpajama"}.get(corpus, corpus), d.data_dir,
                          d.validation_dir, overrides)
  t = time.time()
  try:
    from t5like.tools import cache_data  # pylint: disable=g-import-not-at-top
    import apache_beam  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
    cache_data.run(spec, cache_dir, ["--direct_running_mode=multi_processing",
                                     f"--direct_num_workers={len(os.sched_getaffinity(0))}"])
  except ImportError:
    import seqio  # pylint: disable=g-import-not-at-top
    tasks.register(spec)
    names = [n for n in seqio.TaskRegistry.names() if tasks.spec_of_task(n) == spec]
    kept = [n for n in names if os.path.exists(os.path.join(
        cache_dir, caching.cache_name(n), caching.COMPLETED))]
    caching.build(spec, [n for n in names if n not in kept], cache_dir,
                  min_shards=cache_data.MIN_SHARDS)  # The layout cache_data writes.
  built.add(corpus)
  print(f"cache of {corpus} ready in {time.time() - t:.0f}s", file=sys.stderr)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--corpus_dir", default=os.path.join(tempfile.gettempdir(),
                                                           "t5like_paper_corpus"))
  parser.add_argument("--scale", type=float, default=0.05, help="RedPajama size when generating")
  parser.add_argument("--flan_tasks", type=int, default=1600)
  parser.add_argument("--embedded", action="store_true", help="read the embedded corpora")
  parser.add_argument("--sources", default="jsonl", help="comma-separated: jsonl,tfds,cache")
  parser.add_argument("--smoke", action="store_true",
                      help="embedded corpora, 2 batches of 2 after 1 warm-up: checks it runs")
  parser.add_argument("--batch_size", type=int, default=8)
  parser.add_argument("--warmup", type=int, default=20)
  parser.add_argument("--batches", type=int, default=50)
  parser.add_argument("--only", default="", help="run the rows whose label contains this text")
  parser.add_argument("--json", default="", help="also write the rows to this JSON file")
  parser.add_argument("--flan_grouping", default="", choices=("", "task", "submixture"),
                      help="FLAN pipelines ('' = the preset's: one per sub-mixture)")
  args = parser.parse_args(argv)
  args.sources = [s for s in args.sources.split(",") if s]
  if args.smoke:
    args.embedded, args.batch_size, args.warmup, args.batches = True, 2, 1, 2
  cache_dir = os.path.join(tempfile.gettempdir(), "t5like_embedded_cache") if args.embedded else (
      os.path.join(args.corpus_dir, "cache"))
  built: set = set()
  if not args.embedded:
    _prepare(args.corpus_dir, args)

  rows = []
  for source in args.sources:
    for label, corpus, preset in CASES:
      if args.only and args.only not in label:
        continue
      cfg = preset()
      d = cfg.data
      if args.embedded:
        d.mixture, d.data_dir = f"embedded_{corpus}", ""
      else:
        d.data_dir = os.path.join(args.corpus_dir, corpus)
        d.tfds_data_dir = os.path.join(args.corpus_dir, "tfds")
      d.vocab_path, cfg.model.vocab_size = str(vocab.EMBEDDED_VOCAB), vocab.EMBEDDED_VOCAB_SIZE
      d.source = "jsonl" if source == "cache" else source
      if args.flan_grouping:
        d.flan_grouping = args.flan_grouping
      if source == "cache":
        _cache(cfg, cache_dir, built)
        d.cache_dir = cache_dir
      rows.append((f"{label}, {source}", measure(cfg.validate(), args.batch_size, args.warmup,
                                                 args.batches)))
      # Each row as soon as it is measured: a run stopped later (memory, time) keeps it.
      print(f"  {rows[-1][0]}: {json.dumps(rows[-1][1])}", file=sys.stderr, flush=True)

  cols = ("packed tok/s", "tok/CPU-s", "fill", "cold start s", "resume s", "RSS GiB")
  width = max([len(label) for label, _ in rows] + [10])
  print(f"\nbatch {args.batch_size}, {args.batches} batches after {args.warmup} warm-up, "
        f"{len(os.sched_getaffinity(0))} CPUs, corpus "
        f"{'embedded' if args.embedded else args.corpus_dir}")
  print(f"| {'objective, source':<{width}} | " + " | ".join(f"{c:>13}" for c in cols) + " |")
  print(f"|{'-' * (width + 2)}|" + "|".join("-" * 15 for _ in cols) + "|")
  for label, r in rows:
    cells = [f"{r[c]:>13,.0f}" if c.endswith("/s") or c.endswith("CPU-s") else f"{r[c]:>13.2f}"
             for c in cols]
    print(f"| {label:<{width}} | " + " | ".join(cells) + " |")
  host = CHIP_TOKENS_PER_S * CHIPS_PER_HOST
  print(f"\nCores a {CHIPS_PER_HOST}-chip v5p host needs for the 150M model "
        f"({host / 1e6:.2f}M packed tokens/s): demand / tokens per CPU-second")
  for label, r in rows:
    print(f"  {label:<{width}}  {math.ceil(host / r['tok/CPU-s']):>4} cores")
  if args.json:
    with open(args.json, "w") as f:
      json.dump({label: r for label, r in rows}, f, indent=2)


if __name__ == "__main__":
  main()
