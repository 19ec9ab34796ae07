"""Where a train step's compile time goes, per phase, for the paper configs.

  python benchmarks/compile_time.py --topology v5p-128 configs/decllm_1b.py configs/redllm_1b.py \
      [--eval] [--baseline] [--kernels N] [--by_source N] [--config.key=value ...]

For each config, the trainer's own train step (state layout, shardings, microbatches, remat,
donation: ``step.make_train_step``) for the devices of ``--topology`` (a TPU slice compiled
ahead of time, needs libtpu: ``.venv-tpu``) or the local ones, timed by ``jax.stages`` phase:

- trace:   Python -> jaxpr (``jit(...).trace``): the model's Python code, once per scanned layer;
- lower:   jaxpr -> StableHLO (``Traced.lower``);
- compile: XLA (``Lowered.compile``); JAX does not time its parts, so for a TPU slice they are
  read from libtpu's own log: HLO passes (SPMD partitioning among them), backend, code
  generation, and the final program's VLIW bundle count (load-independent: the backend's time
  follows it);

and counts the program's operations before (StableHLO, one device's view of the global program)
and after XLA (the optimised per-device HLO). The compiled program's temporaries per device and
XLA's cost analysis (bytes accessed; the step-time estimate ``optimal_seconds`` where the backend
gives one: XLA:TPU does for the paper configs, not for every program; both count a scanned
layer body once) compare variants of a config without the accelerator, e.g.
``--config.model.attention_impl=reference`` against ``auto``. ``--eval`` does the same for the eval step,
which a run compiles at its first evaluation (and ``--compile_only`` after the train step). The
persistent compilation cache is off here: every number is a cold compile. ``--baseline`` also
compiles a plain scanned step of each config's shapes (``compile_baseline.py``: a decoder for
DecLLM, an encoder-decoder for RedLLM; with ``model.moe``, textbook one-hot MoE layers).
``--kernels N`` (a TPU slice) also splits the backend by kernel: libtpu compiles each kernel of
the program (a fusion, a collective, a sort) on a thread of its own and logs when it starts and
ends, so each kernel's seconds on its thread add up by kind (collectives, fusions by their
leading ops, sorts, ...): the N largest kinds follow each row. ``--by_source N`` (a TPU slice)
adds those seconds up by the model source each kernel came from: its phase (``bwd`` when
its op is a ``transpose(...)``, else ``fwd``) and its ``--by_source_depth`` (3) innermost frames
in ``t5like/`` (``function@models/file.py:line``, innermost first; the plain step's in
``compile_baseline.py``), read from the compiled program's op metadata and stack frames
(``compile_sources.py``); a kernel without such a frame goes by its op (``all-reduce``). One
compile at a time in this process; on a host shared with other work the times are upper bounds.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.compile_sources import (  # noqa: E402
    PACKAGE, Kernel, add_up, by_source, kernel_kind, source_summary)
from t5like.tools import provenance  # noqa: E402

_STABLEHLO_OP = re.compile(r"=\s+(?:\"?)(stablehlo\.[a-z_]+|func\.call|sdy\.[a-z_]+)")
_HLO_OP = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+ = [^ ]+(?: [^ ]+)*? ([a-z][\w\-]*)\(", re.M)


_STAGE = re.compile(r"(HLO_PASSES|BACKEND_PASSES|CODE_GENERATION) stage duration: (\S+)")
_BUNDLES = re.compile(r"final program bundle count: ([\d,]+)")
_PARTITIONER = re.compile(r"HLO pass: xla-partitioner time: ([\d.]+) (us|ms|s|min)\b")
_UNIT = {"h": 3600.0, "min": 60.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
# libtpu's own log of its compile (read from stderr, the only place it says it): the stage
# durations and the final program's bundle count at INFO, XLA's per-pass timers at vmodule 1.
LIBTPU_LOG_ENV = {"TPU_MIN_LOG_LEVEL": "0", "TPU_STDERR_LOG_LEVEL": "0",
                  "TPU_VMODULE": "hlo_pass_pipeline=1"}
LIBTPU_XLA_FLAG = "--xla_enable_scoped_logging_timers=true"
# With the backend's own vmodule (``--kernels``): each kernel's start and end on its thread.
LIBTPU_KERNEL_VMODULE = "deepsea_compiler_backend=2"
_KERNEL_LINE = re.compile(r"^[IWE]\d{4} (\d+):(\d+):([\d.]+)\s+(\d+) deepsea_compiler_backend\.cc:"
                          r"\d+\] (?:\[([^\]]*)\] LLO optimizing [\d,]+ instructions|"
                          r"post-bundle-packing non-empty bundle count: ([\d,]+))", re.M)
_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def op_counts(text: str, pattern: re.Pattern) -> collections.Counter:
  return collections.Counter(m.group(1) for m in pattern.finditer(text))


def _seconds(duration: str) -> float:
  """A Go-style duration as libtpu prints it ("9m50.15s", "477.2ms") -> seconds."""
  return sum(float(v) * _UNIT[u] for v, u in re.findall(r"([\d.]+)(h|min|ms|us|ns|m|s)", duration))


def libtpu_stages(log: str) -> dict:
  """XLA:TPU's compile split from its log: HLO passes (SPMD partitioning among them), the
  backend (LLO scheduling and register allocation, per kernel), code generation, and the
  final program's VLIW bundle count (what the backend's time grows with)."""
  out = {name.lower(): _seconds(d) for name, d in _STAGE.findall(log)}
  part = _PARTITIONER.findall(log)
  if part:
    out["spmd_partitioning"] = sum(float(v) * _UNIT[u] for v, u in part)
  bundles = _BUNDLES.findall(log)
  if bundles:
    out["bundles"] = int(bundles[-1].replace(",", ""))
  return out


def kernel_times(log: str) -> list[Kernel]:
  """Each kernel of libtpu's log at ``LIBTPU_KERNEL_VMODULE``, in the order they end: a thread
  compiles one kernel at a time, from "[name] LLO optimizing" to its bundle count, so its
  seconds are that span on its thread. The program itself (``<no-hlo-instruction>``, which
  spans the whole backend) is left out."""
  open_, out = {}, []
  for h, m, sec, thread, name, bundles in _KERNEL_LINE.findall(log):
    t = int(h) * 3600 + int(m) * 60 + float(sec)
    if name:
      open_[thread] = (name, t)
    elif thread in open_:
      name, t0 = open_.pop(thread)
      if name != "<no-hlo-instruction>":
        out.append(Kernel(name, max(t - t0, 0.0), int(bundles.replace(",", ""))))
  return out


def by_kind(kernels: list[Kernel]) -> dict:
  """Backend seconds per kernel kind (``kernel_kind``) of ``kernel_times``' kernels.
  Returns {kind: {"seconds", "kernels", "bundles"}}, largest first."""
  return add_up(kernels, lambda k: kernel_kind(k.name))


def kernel_summary(kinds: dict, top: int) -> str:
  """One line: the ``top`` kinds' thread-seconds, share of all kernels, count, and the share
  the collectives take together."""
  total = sum(k["seconds"] for k in kinds.values()) or 1.0
  coll = sum(k["seconds"] for n, k in kinds.items() if n in _COLLECTIVES)
  parts = [f"{n} {k['seconds']:.1f} s ({100 * k['seconds'] / total:.0f} %, {k['kernels']}x)"
           for n, k in list(kinds.items())[:top]]
  return (f"backend kernels: {total:.1f} thread-s, collectives {100 * coll / total:.0f} %; "
          + "; ".join(parts))


@contextlib.contextmanager
def captured_fd2():
  """Everything written to file descriptor 2 (C++ logs included) -> ``out["text"]``."""
  sys.stderr.flush()
  saved = os.dup(2)
  out = {}
  with tempfile.TemporaryFile() as f:
    os.dup2(f.fileno(), 2)
    try:
      yield out
    except BaseException as e:  # The log's tail says why, unless XLA's own error does.
      if type(e).__name__ != "JaxRuntimeError":
        f.seek(0)
        os.write(saved, f.read()[-20000:])
      raise
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      f.seek(0)
      out["text"] = f.read().decode(errors="replace")


def measure(cfg, devices, which: str = "train", compile_: bool = True,
            source_depth: int = 0) -> dict:
  """Phase seconds and op counts of ``cfg``'s train (or eval) step compiled for ``devices``;
  with ``source_depth``, also its kernels' seconds by model source (``"sources"``)."""
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
  with jax.set_mesh(mesh), partitioning.axis_rules(mesh):
    traced = fn.fn.trace(*args)
    t1 = time.perf_counter()
    lowered = traced.lower()
  t2, c2 = time.perf_counter(), time.process_time()
  with captured_fd2() as log:
    compiled = lowered.compile() if compile_ else None
  t3, c3 = time.perf_counter(), time.process_time()
  before = op_counts(lowered.as_text(), _STABLEHLO_OP)
  hlo = (compiled.as_text() or "") if compiled else ""
  after = op_counts(hlo, _HLO_OP)
  return {**program_costs(compiled), "trace_lower_cpu_s": c2 - c0, "compile_cpu_s": c3 - c2,
          "trace_s": t1 - t0, "lower_s": t2 - t1, "compile_s": t3 - t2, "total_s": t3 - t0,
          "ops_before": sum(before.values()), "ops_after": sum(after.values()),
          "top_before": before.most_common(6), "top_after": after.most_common(6),
          "devices": len(devices), "mesh": dict(mesh.shape), **libtpu_stages(log["text"]),
          **_kernel_splits(log["text"], hlo, source_depth, PACKAGE)}


def _kernel_splits(log: str, hlo: str, source_depth: int, inside: str) -> dict:
  """The backend's kernels by kind and, with ``source_depth``, by their ``source_depth``
  innermost frames under ``inside`` (``compile_sources.by_source``)."""
  kernels = kernel_times(log)
  out = {"kernels": by_kind(kernels)}
  if source_depth and kernels:
    out["sources"] = by_source(kernels, hlo, inside, source_depth)
  return out


def program_costs(compiled) -> dict:
  """Temporaries per device and XLA's step estimate of a compiled step (what the backend gives)."""
  if compiled is None:
    return {}
  out = {"temporaries": compiled.memory_analysis().temp_size_in_bytes}
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
  if cost and cost.get("bytes accessed", 0) > 0:
    out["bytes_accessed"] = float(cost["bytes accessed"])
  if cost and cost.get("optimal_seconds", 0) > 0:  # -1: XLA has no estimate for this program.
    out["estimate_s"] = float(cost["optimal_seconds"])
  return out


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("configs", nargs="+", help="config files, e.g. configs/decllm_1b.py")
  parser.add_argument("--topology", default="", help="TPU slice, e.g. v5p-128 (needs libtpu)")
  parser.add_argument("--eval", action="store_true", help="also the eval step")
  parser.add_argument("--ops", action="store_true", help="print the most frequent ops")
  parser.add_argument("--lower_only", action="store_true",
                      help="trace and lower only (no XLA compile): the StableHLO op counts")
  parser.add_argument("--baseline", action="store_true",
                      help="also a plain scanned step at each config's shapes (a decoder, an "
                           "encoder-decoder: benchmarks/compile_baseline.py), in the same run")
  parser.add_argument("--kernels", type=int, default=0, metavar="N",
                      help="with --topology: the backend's N largest kernel kinds per row "
                           "(thread-seconds from libtpu's per-kernel log)")
  parser.add_argument("--by_source", type=int, default=0, metavar="N",
                      help="with --topology: the backend's kernels by the model source that "
                           "produced them (fwd/bwd and the innermost t5like/ frames), the N "
                           "largest groups per row")
  parser.add_argument("--by_source_depth", type=int, default=3, metavar="D",
                      help="frames of t5like/ per --by_source group, innermost first "
                           "(default 3: a model line's matmul takes two in t5like/ops/)")
  args, rest = parser.parse_known_args(argv)
  bad = [r for r in rest if not r.startswith("--config.") or "=" not in r]
  if bad:
    parser.error(f"unrecognised arguments {bad}; overrides look like --config.train.microbatches=2")
  overrides = [r[len("--config."):] for r in rest]
  if args.topology:  # Before libtpu loads: its compile log says where the time went.
    os.environ.update(LIBTPU_LOG_ENV)
    if args.kernels or args.by_source:
      os.environ["TPU_VMODULE"] += "," + LIBTPU_KERNEL_VMODULE
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {LIBTPU_XLA_FLAG}".strip()
  import jax
  from t5like.config import ConfigError, load_config
  from t5like.training import aot
  jax.config.update("jax_enable_compilation_cache", False)  # Cold compiles only.
  try:
    devices = aot.topology_devices(args.topology)[1] if args.topology else jax.devices()
  except ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  stamp = provenance.stamp()
  print(f"# {stamp['host']}, {stamp['cpus']} CPUs, jax {stamp['jax']}"
        f"{', libtpu ' + stamp['libtpu'] if stamp['libtpu'] else ''}, code {stamp['code'] or '?'}, "
        f"{args.topology or 'local devices'}, {stamp['date']}"
        f"{', overrides ' + ' '.join(overrides) if overrides else ''}")
  print("| config | step | trace s | lower s | XLA compile s | CPU s: trace+lower / compile | "
        "XLA:TPU s: HLO passes (SPMD) / backend / code gen | bundles | StableHLO ops | "
        "HLO ops after XLA | temporaries GiB | XLA: bytes accessed GB / step estimate s |")
  print("|---|---|---|---|---|---|---|---|---|---|---|---|")
  for path in args.configs:
    try:
      cfg = load_config(path, overrides)
    except ConfigError as e:
      print(f"error: {e}", file=sys.stderr)
      return 2
    name = os.path.splitext(os.path.basename(path))[0]
    for which in ("train", "eval") if args.eval else ("train",):
      try:
        r = measure(cfg, devices, which, compile_=not args.lower_only,
                    source_depth=args.by_source_depth if args.by_source else 0)
      except jax.errors.JaxRuntimeError as e:  # E.g. XLA:TPU refusing a program over the HBM.
        hint = (" (try --config.train.microbatches=N or --config.model.remat_policy=full)"
                if "RESOURCE_EXHAUSTED" in str(e) else "")  # Other failures: the compiler's own.
        print(f"| {name} | {which} | does not compile: {str(e).splitlines()[0][:200]}{hint} |",
              flush=True)
        continue
      print(_row(name, which, r), flush=True)
      _print_kernels(r, args)
      if args.ops:
        print(f"|   | most frequent | | | | | | | {r['top_before']} | {r['top_after']} |",
              flush=True)
    if args.baseline and not args.lower_only:
      r = _baseline(cfg, devices, args.by_source_depth if args.by_source else 0)
      plain = "plain" + (" MoE" if cfg.model.moe.enabled else "") + (
          " decoder" if cfg.model.family == "decllm" else " encoder-decoder")
      print(_row(f"{name}: {plain}", "train", r), flush=True)
      _print_kernels(r, args)
  return 0


def _print_kernels(r: dict, args: argparse.Namespace) -> None:
  """The lines under a row that ``--kernels`` and ``--by_source`` ask for."""
  if args.kernels and r.get("kernels"):
    print(f"|   | {kernel_summary(r['kernels'], args.kernels)} |", flush=True)
  if args.by_source and r.get("sources"):
    print("\n".join(source_summary(r["sources"], args.by_source)), flush=True)


def _baseline(cfg, devices, source_depth: int = 0) -> dict:
  from benchmarks import compile_baseline
  with captured_fd2() as log:
    r = compile_baseline.measure(cfg, devices)
  ops_before = sum(op_counts(r["lowered"].as_text(), _STABLEHLO_OP).values())
  hlo = r["compiled"].as_text() or ""
  ops_after = sum(op_counts(hlo, _HLO_OP).values())
  return {**r, "trace_s": 0.0, "ops_before": ops_before, "ops_after": ops_after,
          **program_costs(r["compiled"]), **libtpu_stages(log["text"]),  # Its frames are its
          **_kernel_splits(log["text"], hlo, source_depth, compile_baseline.__file__)}  # file's.


def _row(name: str, which: str, r: dict) -> str:
  stages = "—"
  if "backend_passes" in r:
    stages = (f"{r.get('hlo_passes', 0):.1f} ({r.get('spmd_partitioning', 0):.1f}) / "
              f"{r['backend_passes']:.1f} / {r.get('code_generation', 0):.1f}")
  bundles = f"{r['bundles']:,}" if "bundles" in r else "—"
  temps = f"{r['temporaries'] / 2**30:.3g}" if "temporaries" in r else "—"
  estimate = (f"{r['bytes_accessed'] / 1e9:.3g}" if "bytes_accessed" in r else "—") + " / " + (
      f"{r['estimate_s']:.4f}" if "estimate_s" in r else "—")
  return (f"| {name} | {which} | {r['trace_s']:.1f} | {r['lower_s']:.1f} | "
          f"{r['compile_s']:.1f} | {r['trace_lower_cpu_s']:.1f} / {r['compile_cpu_s']:.1f} | "
          f"{stages} | {bundles} | {r['ops_before']} | {r['ops_after']} | {temps} | {estimate} |")


if __name__ == "__main__":
  sys.exit(main())
