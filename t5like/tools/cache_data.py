r"""Caches a corpus's tokenised documents once, on Beam, for every host and run (docs/data.md).

  python -m t5like.tools.cache_data --corpus redpajama --data_dir gs://b/redpajama_v1 \
    --output_dir gs://b/cache [--config.data.vocab_path=gs://b/spm.model] \
    --runner=DataflowRunner --project=P --region=R --temp_location=gs://b/tmp \
    --sdk_container_image=REGISTRY/t5like-beam --experiments=use_runner_v2
  python -m t5like.tools.cache_data --corpus embedded_flan --output_dir /tmp/cache \
    --direct_running_mode=multi_processing --direct_num_workers=2

Then train with ``--config.data.cache_dir=<output_dir>`` (the same ``data.*`` settings).

Each Beam element is one source file of one split of one corpus part; a worker registers the
corpus from its settings (`t5like.data.tasks.register`, no driver state), reads and checks the
file's records, tokenises them with seqio's vocabulary (``task.preprocess_precache``) and writes
them, in file order, as cache shard ``i`` (or as ``--min_shards`` shards round robin in a split of
fewer files, so that each host reads only its share: `t5like.data.host_shards`). Per split and per part the
counts (examples, tokens, good and bad records, FLAN's per-file records for the mixing rates) are
gathered into seqio's ``info``/``stats`` files and ``t5like_cache.json``; ``COMPLETED`` comes last.
Parts already cached from the same data are kept (``--overwrite`` rebuilds them).
Flags other than ours and ``--config.data.*`` are Beam pipeline options (default: DirectRunner).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from t5like import cli

BEAM = ("Beam pipeline options (any other flag), e.g. --runner=DataflowRunner --project=P "
        "--region=R --temp_location=gs://b/tmp --sdk_container_image=IMAGE "
        "--num_workers=N --max_num_workers=N --experiments=use_runner_v2, or locally "
        "--direct_running_mode=multi_processing --direct_num_workers=N")
CORPORA = ("embedded_flan", "embedded_redpajama", "flan", "redpajama")
# seqio's cache_tasks_main default too; a multiple of every power-of-two host count up to 64
# (v5p-128: 16 hosts, v5e-256: 64), so that each of them reads only its share of a small part.
MIN_SHARDS = 64


class _Worker:
  """What a Beam worker holds: the corpus settings, registered once per worker process."""

  def __init__(self, spec, output_dir: str, min_shards: int) -> None:
    self.spec, self.output_dir, self.min_shards = spec, output_dir, min_shards

  def task(self, name: str):
    import seqio  # pylint: disable=g-import-not-at-top

    from t5like import runtime  # pylint: disable=g-import-not-at-top
    from t5like.data import tasks  # pylint: disable=g-import-not-at-top

    runtime.init_tensorflow()
    tasks.register(self.spec)  # Idempotent: a no-op after the first element.
    return seqio.get_mixture_or_task(name)

  def shard(self, item: tuple[str, str, int]):
    from apache_beam import metrics  # pylint: disable=g-import-not-at-top

    from t5like.data import caching  # pylint: disable=g-import-not-at-top

    name, split, index = item
    result = caching.cache_shard(self.task(name), self.spec, split, index, self.output_dir,
                                 self.min_shards)
    for key, n in [("examples", result.examples)] + sorted(result.records.items()):
      metrics.Metrics.counter(f"{caching.cache_name(name)}/{split}", key).inc(n)
    return result


def _existing(spec, task, output_dir: str, overwrite: bool) -> bool:
  """Whether ``task`` is already cached there from the same data (raises if from other data)."""
  import os  # pylint: disable=g-import-not-at-top

  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from t5like.data import caching  # pylint: disable=g-import-not-at-top

  path = os.path.join(output_dir, caching.cache_name(task.name))
  if overwrite or not tf.io.gfile.exists(path):
    if tf.io.gfile.exists(path):
      tf.io.gfile.rmtree(path)
    return False
  try:
    caching.attach(task, spec, output_dir)
  except caching.CacheError as e:
    if tf.io.gfile.exists(os.path.join(path, caching.COMPLETED)):
      raise cli.UserError(f"{e}\n(pass --overwrite to replace {path})") from None
    tf.io.gfile.rmtree(path)  # An interrupted build: start it again.
    return False
  finally:
    caching.detach(task.name)
  return True


def run(spec, output_dir: str, pipeline_args: Sequence[str], overwrite: bool = False,
        min_shards: int = MIN_SHARDS) -> dict[str, Any]:
  """Builds the cache of every part of ``spec`` under ``output_dir``; returns a summary."""
  import apache_beam as beam  # pylint: disable=g-import-not-at-top
  import seqio  # pylint: disable=g-import-not-at-top
  from apache_beam.options.pipeline_options import PipelineOptions  # pylint: disable=g-import-not-at-top

  from t5like.data import caching, tasks  # pylint: disable=g-import-not-at-top

  tasks.register(spec)
  names = sorted(n for n in seqio.TaskRegistry.names() if tasks.spec_of_task(n) == spec)
  todo = [n for n in names if not _existing(spec, seqio.get_mixture_or_task(n), output_dir,
                                            overwrite)]
  idents = {n: caching.identity(spec, seqio.get_mixture_or_task(n)) for n in todo}
  items = [w for n in todo for w in caching.work_items(seqio.get_mixture_or_task(n))]
  worker = _Worker(spec, output_dir, min_shards)
  if items:
    with beam.Pipeline(options=PipelineOptions(list(pipeline_args))) as p:
      splits = (p | "files" >> beam.Create(items) | "spread" >> beam.Reshuffle()
                | "tokenise" >> beam.Map(worker.shard)
                | "by_split" >> beam.Map(lambda r: ((r.task, r.split), r))
                | "group_split" >> beam.GroupByKey()
                | "finish_split" >> beam.MapTuple(lambda key, rs: (key[0], caching.finish_split(
                    output_dir, key[0], key[1], list(rs)))))
      _ = (splits | "group_task" >> beam.GroupByKey()
           | "finish_task" >> beam.MapTuple(lambda name, ss: caching.finish_task(
               output_dir, name, idents[name], list(ss))))
  summary = {"output_dir": output_dir, "built": [caching.cache_name(n) for n in todo],
             "kept": [caching.cache_name(n) for n in names if n not in todo], "parts": {}}
  for n in names:
    manifest = caching.load_manifest(
        f"{output_dir.rstrip('/')}/{caching.cache_name(n)}") or {}
    summary["parts"][caching.cache_name(n)] = {
        "examples": manifest.get("examples"), "records": manifest.get("records")}
  return summary


def main(argv: Sequence[str] | None = None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=BEAM)
  p.add_argument("--corpus", required=True, choices=CORPORA)
  p.add_argument("--data_dir", default="", help="corpus root (local or gs://)")
  p.add_argument("--validation_dir", default="", help="RedPajama held-out root (cached too)")
  p.add_argument("--output_dir", required=True, help="the cache (data.cache_dir), any URI")
  p.add_argument("--overwrite", action="store_true", help="rebuild parts already cached")
  p.add_argument("--min_shards", type=int, default=MIN_SHARDS, help=(
      "a split with fewer source files is written as this many shards per file, so that any "
      "host count dividing it reads only its share; give a multiple of the training run's host "
      f"count (default {MIN_SHARDS}: every power of two up to 64 hosts; 1: shard i = file i)"))
  cli.add_debug_argument(p)
  args, rest = p.parse_known_args(sys.argv[1:] if argv is None else list(argv))
  overrides = cli.split_overrides(p, [a for a in rest if a.startswith("--config.")])
  beam_args = [a for a in rest if not a.startswith("--config.")]
  from t5like import runtime  # pylint: disable=g-import-not-at-top
  from t5like.data import sources  # pylint: disable=g-import-not-at-top

  runtime.init_tensorflow()
  try:
    from t5like.data import tasks  # pylint: disable=g-import-not-at-top
    spec = tasks.cache_spec(args.corpus, args.data_dir, args.validation_dir, overrides)
    if args.min_shards < 1:
      raise cli.UserError(f"--min_shards={args.min_shards}: give 1 or more")
    summary = run(spec, args.output_dir, beam_args, overwrite=args.overwrite,
                  min_shards=args.min_shards)
  except sources.LayoutError as e:
    raise SystemExit(f"cache_data: {e}") from None
  print(json.dumps(summary, indent=2, sort_keys=True))
  print(f"train with: --config.data.cache_dir={args.output_dir}", file=sys.stderr)
  return summary


if __name__ == "__main__":
  sys.exit(cli.guard(main))
