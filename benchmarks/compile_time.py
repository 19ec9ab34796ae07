"""Where a train step's compile time goes, per phase, for the paper configs.

  python benchmarks/compile_time.py --topology v5p-128 configs/decllm_1b.py configs/redllm_1b.py \
      [--eval] [--config.key=value ...] [--csv OUT]

For each config, the trainer's own train step (state layout, shardings, microbatches, remat,
donation: ``step.make_train_step``) for the devices of ``--topology`` (a TPU slice compiled
ahead of time, needs libtpu: ``.venv-tpu``) or the local ones, timed by ``jax.stages`` phase:

- trace:   Python -> jaxpr (``jit(...).trace``): the model's Python code, once per scanned layer;
- lower:   jaxpr -> StableHLO (``Traced.lower``);
- compile: XLA: SPMD partitioning, the HLO optimisation passes and the backend's code generation
  (``Lowered.compile``), together — JAX does not time them apart;

and counts the program's operations before (StableHLO, one device's view of the global program)
and after XLA (the optimised per-device HLO). ``--eval`` does the same for the eval step, which a
run compiles at its first evaluation (and ``--compile_only`` after the train step). The
persistent compilation cache is off here: every number is a cold compile. One compile at a time
in this process; on a host shared with other work the times are upper bounds.
"""
from __future__ import annotations

import argparse
import collections
import os
import platform
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_STABLEHLO_OP = re.compile(r"=\s+(?:\"?)(stablehlo\.[a-z_]+|func\.call|sdy\.[a-z_]+)")
_HLO_OP = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+ = [^ ]+(?: [^ ]+)*? ([a-z][\w\-]*)\(", re.M)


def op_counts(text: str, pattern: re.Pattern) -> collections.Counter:
  return collections.Counter(m.group(1) for m in pattern.finditer(text))


def measure(cfg, devices, which: str = "train", compile_: bool = True) -> dict:
  """Phase seconds and op counts of ``cfg``'s train (or eval) step compiled for ``devices``."""
  import jax
  from t5like import partitioning
  from t5like.training import aot
  from t5like.training import state as state_lib
  from t5like.training import step as step_lib
  mesh = partitioning.make_mesh(cfg.mesh, devices)
  setup = state_lib.build_setup(cfg, mesh)
  if which == "train":
    fn = step_lib.make_train_step(setup)
    args = (setup.abstract_state, aot.abstract_batch(cfg, setup.batch_sharding,
                                                     cfg.train.batch_size))
  else:
    fn = step_lib.make_eval_step(setup)
    args = (setup.abstract_state.params, aot.abstract_batch(
        cfg, setup.batch_sharding, cfg.train.eval_batch_size or cfg.train.batch_size))
  t0, c0 = time.perf_counter(), time.process_time()
  with jax.set_mesh(mesh), partitioning.axis_rules():
    traced = fn.fn.trace(*args)
    t1 = time.perf_counter()
    lowered = traced.lower()
  t2, c2 = time.perf_counter(), time.process_time()
  compiled = lowered.compile() if compile_ else None
  t3, c3 = time.perf_counter(), time.process_time()
  before = op_counts(lowered.as_text(), _STABLEHLO_OP)
  after = op_counts((compiled.as_text() or "") if compiled else "", _HLO_OP)
  return {"trace_lower_cpu_s": c2 - c0, "compile_cpu_s": c3 - c2, "trace_s": t1 - t0, "lower_s": t2 - t1, "compile_s": t3 - t2, "total_s": t3 - t0,
          "ops_before": sum(before.values()), "ops_after": sum(after.values()),
          "top_before": before.most_common(6), "top_after": after.most_common(6),
          "devices": len(devices), "mesh": dict(mesh.shape)}


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("configs", nargs="+", help="config files, e.g. configs/decllm_1b.py")
  parser.add_argument("--topology", default="", help="TPU slice, e.g. v5p-128 (needs libtpu)")
  parser.add_argument("--eval", action="store_true", help="also the eval step")
  parser.add_argument("--ops", action="store_true", help="print the most frequent ops")
  parser.add_argument("--lower_only", action="store_true",
                      help="trace and lower only (no XLA compile): the StableHLO op counts")
  parser.add_argument("--causal_max_blocks", type=int, default=0,
                      help="experiment: query blocks of causal attention "
                           "(t5like.ops.xla.CAUSAL_MAX_BLOCKS; 0 = as shipped)")
  args, rest = parser.parse_known_args(argv)
  bad = [r for r in rest if not r.startswith("--config.") or "=" not in r]
  if bad:
    parser.error(f"unrecognised arguments {bad}; overrides look like --config.train.microbatches=2")
  overrides = [r[len("--config."):] for r in rest]
  import jax
  from t5like.config import ConfigError, load_config
  from t5like.training import aot
  jax.config.update("jax_enable_compilation_cache", False)  # Cold compiles only.
  if args.causal_max_blocks:  # Experiment only: the model's own constant, set before tracing.
    from t5like.ops import xla
    xla.CAUSAL_MAX_BLOCKS = args.causal_max_blocks
  note = f", CAUSAL_MAX_BLOCKS={args.causal_max_blocks}" if args.causal_max_blocks else ""
  try:
    devices = aot.topology_devices(args.topology)[1] if args.topology else jax.devices()
  except ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, jax "
        f"{jax.__version__}, {args.topology or 'local devices'}, {time.strftime('%Y-%m-%d')}"
        f"{', overrides ' + ' '.join(overrides) if overrides else ''}{note}")
  print("| config | step | trace s | lower s | compile s | total s | CPU s: trace+lower / "
        "compile | StableHLO ops | HLO ops after XLA |")
  print("|---|---|---|---|---|---|---|---|---|")
  for path in args.configs:
    try:
      cfg = load_config(path, overrides)
    except ConfigError as e:
      print(f"error: {e}", file=sys.stderr)
      return 2
    name = os.path.splitext(os.path.basename(path))[0]
    for which in ("train", "eval") if args.eval else ("train",):
      r = measure(cfg, devices, which, compile_=not args.lower_only)
      print(f"| {name} | {which} | {r['trace_s']:.1f} | {r['lower_s']:.1f} | "
            f"{r['compile_s']:.1f} | {r['total_s']:.1f} | {r['trace_lower_cpu_s']:.1f} / "
            f"{r['compile_cpu_s']:.1f} | {r['ops_before']} | "
            f"{r['ops_after']} |", flush=True)
      if args.ops:
        print(f"|   | most frequent | | | | | | {r['top_before']} | {r['top_after']} |",
              flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
