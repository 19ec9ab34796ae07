"""Where a run's wall time went: ``python -m t5like.tools.goodput WORKDIR [--json]``.

Reads the goodput records every run of ``WORKDIR`` (a local path or any URI, gs:// included)
wrote (``t5like/training/goodput.py``) and prints per run and in total the wall time, the share
in productive steps and the share of each other cause. Needs no accelerator and no JAX backend.
"""
from __future__ import annotations

import argparse
import json
import sys

from t5like import cli
from t5like.config import ConfigError


def main(argv: list[str] | None = None) -> int:
  return cli.guard(_main, argv)


def _main(argv: list[str]) -> int:
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("workdir", help="a training run's --workdir (gs:// included)")
  ap.add_argument("--json", action="store_true", help="print the records and their sum as JSON")
  args = ap.parse_args(argv)
  from t5like import paths
  from t5like.training import goodput
  workdir = paths.resolve(args.workdir)
  records = goodput.read_records(workdir)
  if not records:
    raise ConfigError(f"{workdir} holds no goodput records ({goodput.DIR}/*.json): is it the "
                      "--workdir of a training run?")
  if args.json:
    total = goodput.summarize(records)
    print(json.dumps({"runs": records, "total": total, "shares": goodput.shares(total)},
                     indent=1))
  else:
    print(goodput.format_summary(records))
  return 0


if __name__ == "__main__":
  sys.exit(main())
