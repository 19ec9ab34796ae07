r"""Prepares a corpus once for every host: mixing counts and (optionally) the TFDS conversion.

  python -m t5like.tools.prepare_data --data_dir gs://bucket/flan --corpus flan
  python -m t5like.tools.prepare_data --data_dir gs://bucket/redpajama_v1 --corpus redpajama \
    --tfds_data_dir gs://bucket/tfds [--validation_dir gs://bucket/rp_val] \
    [--runner=DataflowRunner --project=P --region=R --temp_location=gs://bucket/tmp ...]

* Counts: the good-record counts behind FLAN's examples-proportional rates go to
  ``$T5LIKE_CACHE/counts/`` keyed by the corpus (`t5like.data.counts`; nothing is written into
  the corpus), so no host parses every task file at start-up when ``T5LIKE_CACHE`` is shared
  (e.g. ``gs://bucket/t5like_cache``). They are recomputed only for files whose size or
  modification time changed. (A corpus cache, ``t5like.tools.cache_data``, counts on Beam.)
* ``--tfds_data_dir``: converts the corpus into TFDS datasets there (a bucket for multi-host
  runs; then train with ``data.source=tfds`` and the same ``data.tfds_data_dir``) on Beam: TFDS
  runs one pipeline per RedPajama subset or FLAN part, one element per file; flags other than
  ours are Beam pipeline options (default: the DirectRunner; ``--direct_running_mode=
  multi_processing --direct_num_workers=N`` locally, ``--runner=DataflowRunner ...`` with
  ``docker/beam.Dockerfile``'s image). Needs the ``[beam]`` extra. A conversion already built
  from the same files is kept; only missing parts are built.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Sequence

from t5like import cli, runtime
from t5like.data import counts, sources
from t5like.errors import UserError

BEAM = ("Beam pipeline options (any other flag), e.g. --runner=DataflowRunner --project=P "
        "--region=R --temp_location=gs://b/tmp --sdk_container_image=IMAGE "
        "--num_workers=N --max_num_workers=N --experiments=use_runner_v2, or locally "
        "--direct_running_mode=multi_processing --direct_num_workers=N")


def _beam_options(rest: Sequence[str]) -> list[str]:
  try:
    import apache_beam  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    raise UserError("the TFDS conversion runs on Apache Beam, which this environment lacks: "
                    "install the [beam] extra (pip install -e '.[beam]', as `make test-beam` "
                    "does in .venv-beam), or let training convert on first use "
                    "(data.source=tfds)") from None
  return list(rest)


def convert_redpajama(root: str, data_dir: str, *, beam_options: Sequence[str],
                      validation_dir: str = "", policy: str = "skip",
                      subsets: Sequence[str] | None = None) -> dict:
  """Converts every subset on Beam; returns {subset: {"seconds", "examples"}}."""
  from t5like.data import tfds_builder  # pylint: disable=g-import-not-at-top

  out = {}
  for subset in list(subsets or sources.redpajama_subsets(root)):
    t = time.time()
    builder = tfds_builder.prepare_redpajama(root, data_dir, subsets=[subset],
                                             validation_dir=validation_dir, policy=policy,
                                             beam_options=beam_options)[subset]
    out[subset] = {"seconds": round(time.time() - t, 1), "examples": {
        s: builder.info.splits[s].num_examples for s in builder.info.splits}}
  return out


def main(argv: Sequence[str] | None = None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=BEAM)
  p.add_argument("--data_dir", required=True, help="corpus root (local or gs://)")
  p.add_argument("--corpus", required=True, choices=("redpajama", "flan"))
  p.add_argument("--tfds_data_dir", default="", help="convert to TFDS there ('' = counts only)")
  p.add_argument("--validation_dir", default="", help="RedPajama held-out root, converted too")
  p.add_argument("--bad_records", default="skip", choices=sources.POLICIES)
  cli.add_debug_argument(p)
  args, rest = p.parse_known_args(sys.argv[1:] if argv is None else list(argv))
  if rest and not args.tfds_data_dir:
    p.error(f"unrecognised arguments {rest} (Beam pipeline options need --tfds_data_dir)")
  runtime.init_tensorflow()
  report: dict = {}
  try:
    if args.corpus == "flan":
      t = time.time()
      c = counts.CorpusCounts(args.data_dir, sources.FLAN_SCHEMA)
      files = [path for task in sources.flan_tasks(args.data_dir) for s, path in task.splits
               if s == "train"]
      n, _ = c.count(files)
      report["counts"] = {"files": len(files), "records": n, "counted": c.counted,
                          "cache": c.cache_path, "seconds": round(time.time() - t, 1)}
      if args.tfds_data_dir:
        from t5like.data import tfds_builder  # pylint: disable=g-import-not-at-top
        t = time.time()
        builders = tfds_builder.prepare_flan(args.data_dir, args.tfds_data_dir,
                                             policy=args.bad_records,
                                             beam_options=_beam_options(rest))
        report["tfds"] = {"seconds": round(time.time() - t, 1), "dir": args.tfds_data_dir,
                          "tasks": len(tfds_builder.flan_task_table(builders))}
    elif args.tfds_data_dir:
      report["tfds"] = convert_redpajama(args.data_dir, args.tfds_data_dir,
                                         beam_options=_beam_options(rest),
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
