#!/usr/bin/env python
"""Evaluate checkpoints written by train.py.

Completions of one checkpoint (KV-cache generation; RedLLM reads the prompt with its encoder):

  python eval.py --workdir DIR --prompt "text" [--prompt_file F] [--max_new_tokens N]
                 [--temperature T --top_k K --top_p P --seed S]

Held-out loss, perplexity and accuracy per task (the default):

  python eval.py --workdir DIR [--step N] [--mixture NAME ...] [--max_batches N]
                 [--no_per_task] [--config.key=value ...]

The paper's evaluations, one or more checkpoints side by side (results.json, report.md, PNGs):

  python eval.py --workdir DEC --workdir RED --suite ppl,tasks,length,cost,attention \
                 [--tasks FILE_OR_DIR ...] [--shots 0,1,5] --output_dir OUT

lm-evaluation-harness tasks (the `[harness]` extra; docs/evaluation.md), side by side:

  python eval.py --workdir DEC --workdir RED --harness arc_easy,hellaswag [--include_path DIR]
                 [--num_fewshot K] [--limit N] --output_dir OUT

The model is rebuilt from the config stored with the checkpoint; ``--config.*`` overrides apply
on top (e.g. ``--config.data.objective=prefix`` scores a DecLLM on the target half of each
prefix split, the tokens RedLLM is scored on). Results: a table on stdout and
``DIR/eval/step_<N>.json``.
"""
from __future__ import annotations

import argparse
import json
import sys

from t5like import cli


def main(argv: list[str] | None = None) -> int:
  from t5like.evaluation.bigbench import TaskFormatError
  from t5like.evaluation.scoring import ContextTooLong
  # Besides UserError: a bad task file, a context too long, a path that does not exist.
  return cli.guard(_main, argv, expected=(TaskFormatError, ContextTooLong, FileNotFoundError))


def _main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", required=True, action="append",
                      help="train.py workdir (or a checkpoint dir); repeat with --suite")
  parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: newest)")
  parser.add_argument("--mixture", action="append", default=[],
                      help="task/mixture to score (repeatable; default: the run's eval mixture)")
  parser.add_argument("--max_batches", type=int, default=0,
                      help="batches per task (default 0: the whole validation split)")
  parser.add_argument("--no_per_task", action="store_true", help="skip the per-part breakdown")
  parser.add_argument("--json", action="store_true", help="print the JSON report instead")
  parser.add_argument("--suite", default="",
                      help="comma-separated evaluations: ppl,tasks,length,cost,attention,experts")
  parser.add_argument("--tokens", default="",
                      help="--suite experts: space-separated pieces whose experts to report, "
                           "e.g. \". , the what\"")
  parser.add_argument("--tasks", action="append", default=[],
                      help="--suite tasks: BIG-bench JSON / FLAN jsonl files or directories, "
                           "or seqio:NAME[@split][#N] for a registered seqio task "
                           "(default: the small tasks shipped with t5like)")
  parser.add_argument("--shots", default="0", help="--suite tasks: e.g. 0,1,5")
  parser.add_argument("--output_dir", default="", help="--suite: where reports go "
                      "(default: <first workdir>/eval/suite)")
  parser.add_argument("--max_context", type=int, default=1024,
                      help="--suite tasks: longest context in tokens")
  parser.add_argument("--on_long", choices=("truncate", "error"), default="truncate",
                      help="--suite tasks: cut longer contexts from the left, or fail the task")
  parser.add_argument("--config", default=None, help=argparse.SUPPRESS)  # Refused, with a hint.
  parser.add_argument("--harness", default="", help="lm-evaluation-harness tasks, comma-"
                      "separated (writes per-checkpoint results JSON, report.md, harness.png)")
  parser.add_argument("--include_path", action="append", default=[],
                      help="--harness: a directory of task YAMLs (repeatable)")
  parser.add_argument("--num_fewshot", type=int, default=None,
                      help="--harness: few-shot examples (default: each task's own)")
  parser.add_argument("--limit", type=float, default=None,
                      help="--harness: examples per task (< 1: a fraction)")
  from t5like.inference import cli as generation_cli
  generation_cli.add_arguments(parser)
  cli.add_debug_argument(parser)
  args, overrides = cli.parse(parser, argv)
  if args.config is not None:
    from t5like.config import ConfigError
    raise ConfigError(f"eval.py takes no --config {args.config}: it reads the config stored with "
                      "the checkpoint in --workdir; change a setting with --config.key=value, "
                      "e.g. --config.data.objective=prefix")

  from t5like import runtime
  from t5like.config import Config, apply_overrides
  from t5like.training import distributed
  runtime.init_tensorflow()  # TF (data only) off accelerators, no false cuInit error on CPU.
  # Like train.py: several hosts evaluate together (flags, JAX_* env, TPU pod, SLURM).
  dist = Config()
  apply_overrides(dist, [o for o in overrides if o.startswith("distributed.")])
  distributed.initialize(dist.distributed)
  from t5like.training import compile_cache  # The evaluated run's cache (docs/pods.md).
  compile_cache.configure_for_eval(args.workdir[0], overrides)
  if args.harness:
    from t5like.evaluation.harness_run import main as harness_main
    return harness_main(args, overrides)
  if args.suite:
    return _suite(args, overrides)
  if generation_cli.wants_generation(args):
    return generation_cli.run(args, overrides)
  from t5like.evaluation.checkpoint_eval import evaluate_checkpoint, format_report
  report = evaluate_checkpoint(args.workdir[0], step=args.step, overrides=overrides,
                               mixtures=args.mixture, per_task=not args.no_per_task,
                               max_batches=args.max_batches)
  print(json.dumps(report, indent=2, sort_keys=True) if args.json else format_report(report))
  if "file" in report:
    print(f"report written to {report['file']}")
  return 0


def _suite(args, overrides) -> int:
  from etils import epath
  from t5like.config import ConfigError
  from t5like.evaluation.suite import run_suite
  if overrides:
    raise ConfigError("--config.* overrides do not apply to --suite")
  out = args.output_dir or str(epath.Path(args.workdir[0]) / "eval" / "suite")
  try:
    shots = [int(s) for s in args.shots.split(",") if s.strip()]
  except ValueError:
    raise ConfigError(f"--shots {args.shots!r}: give comma-separated integers, e.g. 0,1,5"
                      ) from None
  results = run_suite(args.workdir, [s.strip() for s in args.suite.split(",") if s.strip()],
                      output_dir=out, step=args.step, task_paths=args.tasks, shots=shots,
                      max_batches=args.max_batches or 8, max_context=args.max_context,
                      on_long=args.on_long, expert_tokens=args.tokens)
  from t5like.evaluation.suite import all_plots, check_failures
  print((epath.Path(out) / "report.md").read_text())
  print(f"report: {out}/report.md, results: {out}/results.json, plots: {all_plots(results)}")
  check_failures(results, out)  # A suite that failed fails the command (after the report).
  return 0


if __name__ == "__main__":
  from t5like import runtime
  runtime.libtpu_init_args()  # Before JAX: libtpu's compiler stacks (t5like/runtime.py).
  sys.exit(main())
