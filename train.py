#!/usr/bin/env python
"""Train a DecLLM or RedLLM.

  python train.py --config configs/<name>.py --workdir DIR [--config.key=value ...]

With no arguments: the tiny DecLLM on the embedded data (configs/tiny_decllm.py) in
runs/tiny_decllm, a few minutes on 2 CPU cores. Running the same command again resumes
from the newest checkpoint in the workdir. Overrides use dotted keys, e.g.
``--config.train.steps=100 --config.mesh.fsdp=4 --config.train.init_from=/tmp/run``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from t5like import cli

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CONFIG = os.path.join(HERE, "configs", "tiny_decllm.py")


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  cli.add_config_argument(parser, DEFAULT_CONFIG,
                          "config file defining get_config() (default: configs/tiny_decllm.py)")
  parser.add_argument("--workdir", default="",
                      help="checkpoints, metrics and logs go here (default: runs/<config name>)")
  parser.add_argument("--print_config", action="store_true",
                      help="print the resolved config as JSON and exit")
  parser.add_argument("--compile_only", action="store_true",
                      help="compile the train and eval steps, print memory per chip, FLOPs and a "
                           "roofline step time, and exit (nothing is trained; only the workdir's "
                           "compilation cache is written)")
  parser.add_argument("--topology", default="",
                      help="with --compile_only: compile for a TPU slice that need not exist "
                           "here, e.g. v5p-128, v5e-256, v6e-64, v5p:4x4x4 (needs libtpu: "
                           "pip install -e '.[tpu]')")
  parser.add_argument("--num_slices", type=int, default=1,
                      help="with --topology: that many such slices joined over DCN (multi-slice; "
                           "mesh.slices follows)")
  cli.add_debug_argument(parser)
  return cli.parse(parser, argv)


def main(argv: list[str] | None = None) -> int:
  return cli.guard(_main, argv)


def _main(argv: list[str]) -> int:
  args, overrides = parse_args(argv)
  from t5like.config import ConfigError, to_json
  cfg = cli.load(args.config, overrides)
  if args.print_config:
    print(to_json(cfg))
    return 0
  if args.topology and not args.compile_only:
    raise ConfigError("--topology needs --compile_only")
  if args.num_slices != 1 and not args.topology:
    raise ConfigError("--num_slices needs --topology (the slices of a TPU topology)")
  from t5like import runtime
  runtime.init_tensorflow()  # TF (data only) off accelerators, quiet, no false cuInit error.
  if args.compile_only:
    return _compile_only(cfg, args)
  name = os.path.splitext(os.path.basename(args.config))[0]
  workdir = args.workdir or os.path.join("runs", name)
  from t5like.training import run
  result = run(cfg, workdir)
  if result.get("stopped_by") == "Ctrl-C":  # Saved and said so (one line): not a finished run.
    return cli.EXIT_INTERRUPTED
  summary = {k: result.get(k) for k in (
      "step", "loss", "eval_loss", "eval_accuracy", "tokens_per_sec", "mfu", "goodput",
      "preempted")}
  print(json.dumps(summary, indent=2, default=str))
  print(f"workdir:     {result['workdir']}")
  print(f"checkpoint:  {result['checkpoint_dir']}/{result['latest_checkpoint']}")
  print(f"metrics:     {result['metrics_file']}")
  print(f"tensorboard: tensorboard --logdir {result['tensorboard_dir']}")
  print(f"log:         {os.path.join(result['workdir'], 'train.log')}")
  print(f"goodput:     python -m t5like.tools.goodput {result['workdir']}")
  return 0


def _compile_only(cfg, args) -> int:
  from t5like.training import aot, fit
  name = os.path.splitext(os.path.basename(args.config))[0]  # Its compilation cache: the run's.
  report = fit.run_compile_only(cfg, args.topology, args.workdir or os.path.join("runs", name),
                                args.num_slices)
  print(aot.format_report(os.path.splitext(os.path.basename(args.config))[0], report))
  return 0 if report["fits"] else 1


if __name__ == "__main__":
  from t5like import runtime
  runtime.libtpu_init_args()  # Before JAX: libtpu's compiler stacks (t5like/runtime.py).
  sys.exit(main())
