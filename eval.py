#!/usr/bin/env python
"""Evaluate a checkpoint written by train.py: held-out loss, perplexity and accuracy per task.

  python eval.py --workdir DIR [--step N] [--mixture NAME ...] [--max_batches N]
                 [--no_per_task] [--config.key=value ...]

The model is rebuilt from the config stored with the checkpoint; ``--config.*`` overrides apply
on top (e.g. ``--config.data.objective=prefix`` scores a DecLLM on the target half of each
prefix split, the tokens RedLLM is scored on). Results: a table on stdout and
``DIR/eval/step_<N>.json``.
"""
from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", required=True, help="train.py workdir (or a checkpoint dir)")
  parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: newest)")
  parser.add_argument("--mixture", action="append", default=[],
                      help="task/mixture to score (repeatable; default: the run's eval mixture)")
  parser.add_argument("--max_batches", type=int, default=0,
                      help="batches per task (default 0: the whole validation split)")
  parser.add_argument("--no_per_task", action="store_true", help="skip the per-part breakdown")
  parser.add_argument("--json", action="store_true", help="print the JSON report instead")
  args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
  bad = [r for r in rest if not r.startswith("--config.") or "=" not in r]
  if bad:
    parser.error(f"unrecognised arguments {bad}; overrides look like --config.data.seed=1")
  overrides = [r[len("--config."):] for r in rest]

  from t5like.config import ConfigError
  from t5like.evaluation.checkpoint_eval import evaluate_checkpoint, format_report
  try:
    report = evaluate_checkpoint(args.workdir, step=args.step, overrides=overrides,
                                 mixtures=args.mixture, per_task=not args.no_per_task,
                                 max_batches=args.max_batches)
  except (ConfigError, FileNotFoundError) as e:
    print(f"eval error: {e}", file=sys.stderr)
    return 2
  print(json.dumps(report, indent=2, sort_keys=True) if args.json else format_report(report))
  if "file" in report:
    print(f"report written to {report['file']}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
