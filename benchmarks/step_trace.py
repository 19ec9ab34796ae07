#!/usr/bin/env python
"""Where a whole train step's time goes on XLA:CPU, from a ``jax.profiler`` trace of the step.

  python benchmarks/step_trace.py [--config small_decllm_unrolled] [--dtype float32]
                                  [--steps 2] [--top 25] [--trace_dir DIR]

``step_breakdown.py`` times each piece of the model jitted on its own; this traces the real,
fused step (XLA:CPU's per-kernel trace events, ``--xla_cpu_enable_xprof_traceme``) and prints:

- the step's wall time split by what runs: a matmul kernel (a YNN fusion with a dot, or a dot
  thunk), only other kernels (elementwise / reduction fusions, copies), or no traced kernel at
  all. The last is not always idle: a dot thunk that XLA runs on Eigen (e.g. a weight gradient
  contracted on its operands' first axis) is traced only while it is dispatched, its work on
  the pool's threads is not;
- the step by model part (attention projections and core, MLP, norms + RoPE, masks,
  embedding + logits + loss, residual stream, optimizer, the step's own guard and metrics):
  each kernel is charged to the module of the innermost source frame that ``PART_RULES``
  names, the backward pass to the part whose forward made it;
- thread-milliseconds of kernels per step (the machine has two threads of them per second on
  a two-core host), matmuls against the rest;
- the costliest non-matmul kernels grouped by the JAX operation that made them (the HLO's
  ``op_name``) and their output shape: thread-ms, and their wall time while no matmul runs
  (what the step would lose without them; the rest of their time overlaps a matmul).

The trace slows the step (~10-20 %); shares, not absolute times, are what it is for. The trace
directory (``--trace_dir``) opens in TensorBoard's profile plugin or Perfetto.
"""
from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import sys
import tempfile

_FLAG = "--xla_cpu_enable_xprof_traceme=true"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):  # Before jax is imported: XLA reads it once.
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # A checkout.

import jax  # noqa: E402
from jax.profiler import ProfileData  # noqa: E402

from benchmarks import timing  # noqa: E402
from t5like import partitioning  # noqa: E402
from t5like.config.presets import BENCHMARK_CONFIGS as CONFIGS  # noqa: E402
from t5like.training import state as state_lib  # noqa: E402
from t5like.training import step as step_lib  # noqa: E402
from t5like.training.data import SyntheticData, global_batch  # noqa: E402

# Trace events that are not kernels: the executor, the pool's markers, waits.
_NOT_KERNELS = ("end:", "ThreadpoolListener", "SlinkyThreadPool", "Wait ", "ThunkExecutor", "$")


def hlo_kernels(hlo: str) -> dict[str, tuple[str, bool]]:
  """Instruction name -> (``op_name shape``, is a matmul) from a compiled module's text; a
  custom call (a CPU kernel) by its target."""
  computations = dict(re.findall(r"\n(%[\w.\-]+) [^\n]*\{\n(.*?)\n\}", hlo, re.S))
  out = {}
  for name, dtype, shape, rest in re.findall(r"%([\w.\-]+) = (\w+)\[([\d,]*)\][^ ]* ([^\n]*)",
                                             hlo):
    op = re.search(r'op_name="(?:jit\([^)]*\)/)?([^"]*)"', rest)
    calls = re.search(r"calls=(%[\w.\-]+)", rest)
    is_dot = rest.startswith("dot(") or bool(
        calls and name.startswith("ynn_fusion") and " dot(" in computations.get(calls[1], ""))
    out[name] = (f"{op[1] if op else '?'} {dtype}[{shape}]", is_dot)
  # FFI kernels (t5like/kernels) by their target; a backward's tuple output has no single shape.
  for name, target in re.findall(r'%([\w.\-]+) = [^\n]*? custom-call\([^\n]*?'
                                 r'custom_call_target="([^"]+)"', hlo):
    out[name] = (f"{target} ({out[name][0].split(' ')[-1]})" if name in out else target, False)
  return out


# The part of the model a kernel belongs to, from the innermost frame of its source stack (the
# compiled module's stack-frame tables) that one of these rules names: (file, function name
# fragment or "" for any) -> part. Frames in files no rule names (``t5like/ops``' forms,
# JAX itself) are skipped, so a product is charged to the module that asked for it.
PART_RULES = (
    ("/kernels/head_norm.py", "", "norms + RoPE"), ("/models/norms.py", "", "norms + RoPE"),
    ("/models/rotary.py", "", "norms + RoPE"),
    ("/models/attention.py", "norm_rope", "norms + RoPE"),
    ("/models/masks.py", "", "masks"), ("/kernels/attention_train.py", "", "attention core"),
    ("/ops/fused_attention.py", "", "attention core"),
    ("/models/attention.py", "project_", "attention projections"),
    ("/models/attention.py", "", "attention core"), ("/models/mlp.py", "", "MLP (SwiGLU)"),
    ("/models/embedding.py", "", "embedding, logits + loss"),
    ("/models/losses.py", "", "embedding, logits + loss"),
    ("/training/adafactor.py", "", "optimizer"), ("/training/optimizer.py", "", "optimizer"),
    ("/optax/", "", "optimizer"),
    ("/models/blocks.py", "", "residual stream"), ("/models/stack.py", "", "residual stream"),
    ("/models/decllm.py", "", "residual stream"), ("/models/redllm.py", "", "residual stream"),
    ("/training/step.py", "", "step: loss scale, finite guard, metrics"),
    ("/training/state.py", "", "step: loss scale, finite guard, metrics"),
)
PARTS = tuple(dict.fromkeys(part for *_, part in PART_RULES)) + ("other",)


def _table(hlo: str, name: str) -> dict[int, str]:
  block = re.search(rf"\n{name}\n(.*?)\n\n", hlo, re.S)
  return dict((int(i), rest) for i, rest in
              (line.split(" ", 1) for line in (block[1].splitlines() if block else [])))


def hlo_parts(hlo: str) -> dict[str, str]:
  """Instruction name -> model part (``PART_RULES``) from its ``stack_frame_id``: the module
  text's StackFrames table gives each frame's location and parent (``parent_frame_id`` is the
  parent's id + 1, 1 at the outermost frame), FileLocations its file and function."""
  files = {i: v.strip('"') for i, v in _table(hlo, "FileNames").items()}
  funcs = {i: v.strip('"') for i, v in _table(hlo, "FunctionNames").items()}
  locations = {}
  for i, v in _table(hlo, "FileLocations").items():
    ids = dict(re.findall(r"(\w+)=(\d+)", v))
    locations[i] = (files[int(ids["file_name_id"])], funcs[int(ids["function_name_id"])])
  frames = {i: tuple(int(x) for x in re.findall(r"=(\d+)", v))
            for i, v in _table(hlo, "StackFrames").items()}

  def part(frame: int) -> str:
    seen = set()
    while frame in frames and frame not in seen:
      seen.add(frame)
      location, parent = frames[frame]
      path, func = locations[location]
      for file, fragment, name in PART_RULES:
        if file in path and fragment in func:
          return name
      frame = parent - 1
    return "other"

  parts = {name: part(int(frame)) for name, frame in
           re.findall(r"\n\s*%([\w.\-]+) = [^\n]*stack_frame_id=(\d+)", hlo)}
  # A fusion XLA made without a source frame (e.g. a convert joined to an add): the part most
  # of the instructions it calls come from.
  computations = dict(re.findall(r"\n(%[\w.\-]+) [^\n]*\{\n(.*?)\n\}", hlo, re.S))
  for name, called in re.findall(r"\n\s*%([\w.\-]+) = [^\n]*calls=(%[\w.\-]+)", hlo):
    inner = collections.Counter(parts[n] for n in re.findall(r"%([\w.\-]+) = ",
                                                             computations.get(called, ""))
                                if n in parts)
    if name not in parts and inner:
      parts[name] = inner.most_common(1)[0][0]
  # What is still without one (a layout copy, a wrapped reduce-window): the part of the first
  # instruction that reads it, e.g. a transpose made for a weight gradient's product.
  lines = re.findall(r"\n\s*%([\w.\-]+) = [^\n]*?\(([^\n]*)", hlo)
  for _ in range(3):
    for name, rest in lines:
      for operand in re.findall(r"%([\w.\-]+)", rest):
        if operand not in parts and name in parts:
          parts[operand] = parts[name]
  return parts


def kernel_events(trace_dir: str) -> list[tuple[int, int, str, str]]:
  """(start ns, end ns, thread, kernel name) of every XLA:CPU kernel in the trace."""
  path = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)[0]
  events = []
  for plane in ProfileData.from_file(path).planes:
    for line in plane.lines:
      if "XLAEigen" not in line.name and "PjRtCpuClient" not in line.name:
        continue
      for ev in line.events:
        if not ev.name.startswith(_NOT_KERNELS):
          events.append((ev.start_ns, ev.start_ns + ev.duration_ns, line.name, ev.name))
  return events


def wall_split(events, kernels, parts=None
               ) -> tuple[collections.Counter, collections.Counter, collections.Counter]:
  """Nanoseconds of the traced span during which a matmul runs, only other kernels run, or
  none does; per kernel name, its share of the "only other kernels" time (split evenly
  between the kernels running together): what the step would lose without it; and per
  (model part, is a matmul), the whole span split evenly between the kernels running at each
  instant (``parts``: kernel name -> part; the shares sum to the traced time with a kernel)."""
  is_dot = [kernels.get(name, ("", False))[1] for *_, name in events]
  part = [(parts or {}).get(name, "other") for *_, name in events]
  points = sorted([(s, 1, i) for i, (s, *_) in enumerate(events)]
                  + [(e, -1, i) for i, (_, e, *_) in enumerate(events)])
  running: set[int] = set()
  split, exposed, by_part = (collections.Counter() for _ in range(3))
  prev = points[0][0]
  for t, delta, i in points:
    if any(is_dot[j] for j in running):
      split["matmul"] += t - prev
    elif running:
      split["other kernels only"] += t - prev
      for j in running:
        exposed[events[j][3]] += (t - prev) / len(running)
    else:
      split["no traced kernel"] += t - prev
    for j in running:
      by_part[part[j], is_dot[j]] += (t - prev) / len(running)
    prev = t
    (running.add if delta > 0 else running.discard)(i)
  return split, exposed, by_part


def print_parts(by_part: collections.Counter, untraced_ns: float, steps: int,
                span_ns: float) -> None:
  """The table of the step by model part (``wall_split``'s third result), per step."""
  print("\nThe step by model part (each instant's wall time split evenly between the kernels "
        "running then; the backward pass is charged to the part whose forward made it):\n")
  print("| part | matmul ms | other kernels ms | share of the step |\n|---|---|---|---|")
  for part in sorted(PARTS, key=lambda p: -(by_part[p, True] + by_part[p, False])):
    ns = [by_part[part, dot] for dot in (True, False)]
    if sum(ns) > 0:
      print(f"| {part} | {ns[0] / steps / 1e6:.0f} | {ns[1] / steps / 1e6:.0f} | "
            f"{sum(ns) / span_ns:.0%} |")
  print(f"| no traced kernel (incl. the work of dot thunks run on Eigen's threads) | | "
        f"{untraced_ns / steps / 1e6:.0f} | {untraced_ns / span_ns:.0%} |")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--config", default="small_decllm_unrolled", choices=sorted(CONFIGS))
  timing.add_dtype_flag(ap, "float32")
  ap.add_argument("--steps", type=int, default=2, help="traced steps (after two warm-up steps)")
  ap.add_argument("--top", type=int, default=25, help="non-matmul kernel groups listed")
  ap.add_argument("--trace_dir", default="",
                  help="keep the trace in this local directory (default: a temp dir); the "
                       "trace is read back with a local glob, so not a gs:// URI")
  args = ap.parse_args()
  if "://" in args.trace_dir:
    raise SystemExit(f"--trace_dir must be a local directory, not {args.trace_dir}: the trace "
                     "is read back from disk right after the run")
  if jax.default_backend() != "cpu":
    raise SystemExit("step_trace.py reads XLA:CPU's kernel events; use the accelerator's "
                     "profiler (jax.profiler + TensorBoard) elsewhere")
  cfg = CONFIGS[args.config]()
  cfg.model.dtype = args.dtype
  cfg.validate()
  mesh = partitioning.make_mesh(cfg.mesh)
  setup = state_lib.build_setup(cfg, mesh)
  state = state_lib.init_state(setup)
  batch = global_batch(next(SyntheticData(cfg).train(cfg.train.batch_size, 0, 1)),
                       setup.batch_sharding, cfg.train.batch_size)
  with jax.set_mesh(mesh), partitioning.axis_rules(mesh):
    step = step_lib.make_train_step(setup).lower(state, batch).compile()
  hlo = step.as_text()
  kernels = hlo_kernels(hlo)
  for _ in range(2):
    state, _ = step(state, batch)
  jax.block_until_ready(state)
  trace_dir = args.trace_dir or tempfile.mkdtemp(prefix="t5like_trace_")
  with jax.profiler.trace(trace_dir):
    for _ in range(args.steps):
      state, _ = step(state, batch)
      jax.block_until_ready(state)
  events = kernel_events(trace_dir)
  if not events:
    raise SystemExit(f"no XLA:CPU kernel events in {trace_dir}: XLA_FLAGS must hold {_FLAG} "
                     "before jax starts (this script adds it unless XLA_FLAGS names it already)")
  n = args.steps
  split, exposed, by_part = wall_split(events, kernels, hlo_parts(hlo))
  span = sum(split.values())
  print(f"{args.config} ({args.dtype}), {n} traced steps, {span / n / 1e6:.0f} ms a step "
        f"traced; trace in {trace_dir}\n")
  print("| while | ms per step | share |\n|---|---|---|")
  for state_name in ("matmul", "other kernels only", "no traced kernel"):
    print(f"| {state_name} | {split[state_name] / n / 1e6:.0f} | "
          f"{split[state_name] / span:.0%} |")
  print_parts(by_part, split["no traced kernel"], n, span)
  thread_ms = collections.Counter()
  groups, counts, alone = collections.Counter(), collections.Counter(), collections.Counter()
  for s, e, _, name in events:
    label, is_dot = kernels.get(name, (name, False))
    thread_ms["matmul" if is_dot else "other"] += (e - s) / n / 1e6
    if not is_dot:
      groups[label] += (e - s) / n / 1e6
      counts[label] += 1
  for name, ns in exposed.items():
    alone[kernels.get(name, (name, False))[0]] += ns / n / 1e6
  print(f"\nkernel thread-ms per step: matmuls {thread_ms['matmul']:.0f}, other "
        f"{thread_ms['other']:.0f}\n")
  print("Non-matmul kernels by the JAX operation that made them, costliest first by their wall "
        "time while no matmul runs (their share of the step's \"other kernels only\" time):\n")
  print("| JAX operation and output | kernels per step | thread-ms per step | "
        "ms while no matmul runs |\n|---|---|---|---|")
  for label, _ in sorted(groups.items(), key=lambda kv: -alone[kv[0]])[:args.top]:
    print(f"| {label} | {counts[label] // n} | {groups[label]:.1f} | {alone[label]:.1f} |")


if __name__ == "__main__":
  main()
