r"""Prepares a corpus once for every host: mixing counts and (optionally) the TFDS conversion.

  python -m t5like.tools.prepare_data --data_dir gs://bucket/flan --corpus flan
  python -m t5like.tools.prepare_data --data_dir gs://bucket/redpajama_v1 --corpus redpajama \
    --tfds_data_dir gs://bucket/tfds --processes 7 [--validation_dir gs://bucket/rp_val]

* Counts: the good-record counts behind FLAN's examples-proportional rates go to
  ``$T5LIKE_CACHE/counts/`` keyed by the corpus (`t5like.data.counts`; nothing is written into
  the corpus), so no host parses every task file at start-up when ``T5LIKE_CACHE`` is shared
  (e.g. ``gs://bucket/t5like_cache``). They are recomputed only for files whose size or
  modification time changed.
* ``--tfds_data_dir``: converts the corpus into TFDS datasets there (a bucket for multi-host
  runs; then train with ``data.source=tfds`` and the same ``data.tfds_data_dir``). Both convert
  in parallel (``--processes``): RedPajama one process per subset; FLAN's tasks are hashed into
  `tfds_builder.FLAN_PARTS` fixed parts (one dataset config each), each process converting one
  part at a time. A conversion already built from the same files is kept; only missing parts are
  built.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import sys
import time
from typing import Sequence

from t5like import cli, runtime
from t5like.data import counts, sources


def _convert_subset(args: tuple[str, str, str, str, str]) -> tuple[str, float, dict]:
  root, data_dir, subset, validation_dir, policy = args
  from t5like.data import tfds_builder  # pylint: disable=g-import-not-at-top

  t = time.time()
  builder = tfds_builder.prepare_redpajama(root, data_dir, subsets=[subset],
                                           validation_dir=validation_dir, policy=policy)[subset]
  sizes = {s: builder.info.splits[s].num_examples for s in builder.info.splits}
  return subset, time.time() - t, sizes


def convert_redpajama(root: str, data_dir: str, *, processes: int, validation_dir: str = "",
                      policy: str = "skip", subsets: Sequence[str] | None = None) -> dict:
  """Converts every subset in its own process; returns {subset: {"seconds", "examples"}}."""
  todo = list(subsets or sources.redpajama_subsets(root))
  jobs = [(root, data_dir, s, validation_dir, policy) for s in todo]
  ctx = multiprocessing.get_context("spawn")  # TensorFlow is not fork-safe.
  out = {}
  with concurrent.futures.ProcessPoolExecutor(max(1, min(processes, len(jobs))),
                                              mp_context=ctx) as pool:
    for subset, seconds, sizes in pool.map(_convert_subset, jobs):
      out[subset] = {"seconds": round(seconds, 1), "examples": sizes}
  return out


def main(argv: Sequence[str] | None = None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--data_dir", required=True, help="corpus root (local or gs://)")
  p.add_argument("--corpus", required=True, choices=("redpajama", "flan"))
  p.add_argument("--tfds_data_dir", default="", help="convert to TFDS there ('' = counts only)")
  p.add_argument("--validation_dir", default="", help="RedPajama held-out root, converted too")
  p.add_argument("--processes", type=int, default=multiprocessing.cpu_count())
  p.add_argument("--bad_records", default="skip", choices=sources.POLICIES)
  cli.add_debug_argument(p)
  args = p.parse_args(argv)
  runtime.init_tensorflow()
  report: dict = {}
  try:
    if args.corpus == "flan":
      t = time.time()
      c = counts.CorpusCounts(args.data_dir, sources.FLAN_SCHEMA, threads=args.processes)
      files = [path for task in sources.flan_tasks(args.data_dir) for s, path in task.splits
               if s == "train"]
      n, _ = c.count(files)
      report["counts"] = {"files": len(files), "records": n, "counted": c.counted,
                          "cache": c.cache_path, "seconds": round(time.time() - t, 1)}
      if args.tfds_data_dir:
        from t5like.data import tfds_builder  # pylint: disable=g-import-not-at-top
        t = time.time()
        builders = tfds_builder.prepare_flan(args.data_dir, args.tfds_data_dir,
                                             policy=args.bad_records, processes=args.processes)
        report["tfds"] = {"seconds": round(time.time() - t, 1), "dir": args.tfds_data_dir,
                          "tasks": len(tfds_builder.flan_task_table(builders))}
    elif args.tfds_data_dir:
      report["tfds"] = convert_redpajama(args.data_dir, args.tfds_data_dir,
                                         processes=args.processes,
                                         validation_dir=args.validation_dir,
                                         policy=args.bad_records)
  except sources.LayoutError as e:
    raise SystemExit(f"prepare_data: {e}") from None
  print(json.dumps(report, indent=2, sort_keys=True))
  if args.tfds_data_dir:
    print(f"train with: --config.data.source=tfds --config.data.tfds_data_dir="
          f"{args.tfds_data_dir}", file=sys.stderr)
  return report


if __name__ == "__main__":
  sys.exit(cli.guard(main))
