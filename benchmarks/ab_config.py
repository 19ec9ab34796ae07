#!/usr/bin/env python
"""Config variants of one train step against each other, alternating in one process.

  python benchmarks/ab_config.py [--config small_decllm] [--dtype bfloat16] [--repeats 6]
      --variants "model.remat_policy=none;model.remat_policy=dots_no_batch;model.scan_layers=false"

Each variant is ``;``-separated, a ``,``-separated list of dotted overrides (as after
``--config.`` on ``train.py``; empty = the config as is) applied to a config of
``t5like.config.presets.BENCHMARK_CONFIGS``. All variants are compiled first, then each of
``--repeats`` rounds times ``--steps`` steps of each (the order reverses every round), so all
of them see the same machine: on the shared 2-core hosts a step moves 10-30 % between
processes minutes apart, more than most settings change it. Prints each variant's median step, its ratio to the first variant, and the
first step's loss (variants of the same model agree to rounding).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # A checkout.

import jax  # noqa: E402

from benchmarks import timing  # noqa: E402
from t5like import partitioning, runtime  # noqa: E402
from t5like.config.presets import BENCHMARK_CONFIGS as CONFIGS  # noqa: E402
from t5like.config.schema import apply_overrides  # noqa: E402
from t5like.training import state as state_lib  # noqa: E402
from t5like.training import step as step_lib  # noqa: E402
from t5like.training.data import SyntheticData, global_batch  # noqa: E402


def prepare(config: str, dtype: str, overrides: list[str]):
  """A closure running one compiled train step of the variant, and its first step's loss."""
  cfg = CONFIGS[config]()
  cfg.model.dtype = dtype
  apply_overrides(cfg, overrides)
  cfg.validate()
  setup = state_lib.build_setup(cfg, partitioning.make_mesh(cfg.mesh))
  it = SyntheticData(cfg).train(cfg.train.batch_size, 0, 1)
  batch = global_batch(next(it), setup.batch_sharding, cfg.train.batch_size)
  train_step = step_lib.make_train_step(setup)
  box = [state_lib.init_state(setup)]

  def run() -> float:
    box[0], metrics = train_step(box[0], batch)
    jax.block_until_ready((box[0], metrics))
    return float(metrics["loss"])
  return run, run()  # The first call compiles.


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--config", default="small_decllm", choices=sorted(CONFIGS))
  timing.add_dtype_flag(ap, "bfloat16")
  ap.add_argument("--variants", required=True,
                  help="';'-separated variants, each ','-separated key=value overrides")
  timing.add_repeats_flag(ap, 6, "rounds of --steps steps a variant")
  ap.add_argument("--steps", type=int, default=3, help="steps per variant in a round")
  args = ap.parse_args()
  variants = [v.strip() for v in args.variants.split(";")]
  runs, losses = {}, {}
  for v in variants:
    runs[v], losses[v] = prepare(args.config, args.dtype, [o for o in v.split(",") if o])
    print(f"  compiled {v or '(as is)'}", file=sys.stderr, flush=True)
  times = dict(zip(variants, timing.alternating([runs[v] for v in variants], args.repeats,
                                                calls_per_round=args.steps)))
  print(f"\n{args.config}, {args.dtype}, {args.repeats} rounds x {args.steps} steps a variant; "
        f"{jax.devices()[0].device_kind}; {runtime.huge_pages_state()}\n")
  print("| variant | step ms | first / this | first loss |")
  print("|---|---|---|---|")
  first = statistics.median(times[variants[0]])
  for v in variants:
    m = statistics.median(times[v])
    print(f"| {v or '(as is)'} | {m * 1e3:.0f} | {first / m:.3f}x | {losses[v]:.6f} |")


if __name__ == "__main__":
  main()
