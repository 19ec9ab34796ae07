"""benchmarks/step_trace.py's accounting: which model part each compiled kernel of a real train
step is charged to (from the HLO's source frames), and how concurrent kernels share the wall."""
from __future__ import annotations

import os
import re
import sys

import jax
import pytest

from t5like import partitioning
from t5like.training import state as state_lib, step as step_lib
from t5like.training.data import SyntheticData, global_batch
from train_helpers import REPO, tiny_config


@pytest.fixture(scope="module")
def step_trace():
  # At import the benchmark adds a trace flag to XLA_FLAGS (for jax in its own process) and its
  # folders to sys.path: keep this process's environment (which later subprocess tests inherit)
  # and import path as they were.
  flags, path = os.environ.get("XLA_FLAGS"), list(sys.path)
  sys.path.insert(0, REPO)
  try:
    from benchmarks import step_trace
  finally:
    sys.path[:] = path
    if flags is None:
      os.environ.pop("XLA_FLAGS", None)
    else:
      os.environ["XLA_FLAGS"] = flags
  return step_trace


def test_every_kernel_of_a_train_step_is_charged_to_a_model_part(step_trace):
  cfg = tiny_config("decllm")
  mesh = partitioning.make_mesh(cfg.mesh)
  setup = state_lib.build_setup(cfg, mesh)
  batch = global_batch(next(SyntheticData(cfg).train(cfg.train.batch_size, 0, 1)),
                       setup.batch_sharding, cfg.train.batch_size)
  with jax.set_mesh(mesh), partitioning.axis_rules():
    hlo = step_lib.make_train_step(setup).lower(state_lib.init_state(setup), batch).compile(
    ).as_text()
  parts, kernels = step_trace.hlo_parts(hlo), step_trace.hlo_kernels(hlo)
  # What the step runs as kernels: the fusions, dots and custom calls (the CPU kernels) of the
  # computations that are not a fusion's body (the entry, the scanned layer's loop body).
  fused = set(re.findall(r" fusion\([^\n]*calls=(%[\w.\-]+)", hlo))
  ran = [name for comp, body in re.findall(r"\n(?:ENTRY )?(%[\w.\-]+) [^\n]*\{\n(.*?)\n\}", hlo,
                                          re.S) if comp not in fused
         for name in re.findall(r"%([\w.\-]+) = ", body)
         if re.match(r"(.*fusion|dot|ffi_call|custom-call)", name)]
  assert len(ran) > 50
  unknown = [name for name in ran if parts.get(name, "other") == "other"]
  assert not unknown, unknown
  dots = {parts[name] for name in ran if kernels[name][1]}
  assert {"attention projections", "MLP (SwiGLU)", "embedding, logits + loss"} <= dots
  others = {parts[name] for name in ran if not kernels[name][1]}
  assert {"norms + RoPE", "optimizer", "step: loss scale, finite guard, metrics",
          "residual stream"} <= others
  assert set(parts.values()) <= set(step_trace.PARTS)


def test_concurrent_kernels_share_the_wall_and_the_parts_sum_to_the_traced_time(step_trace):
  kernels = {"mm": ("dot", True), "norm": ("mul", False)}
  parts = {"mm": "MLP (SwiGLU)", "norm": "norms + RoPE"}
  # A product 0-10, a norm 5-15 beside it, then nothing until a norm 20-30 alone.
  events = [(0, 10, "t0", "mm"), (5, 15, "t1", "norm"), (20, 30, "t0", "norm")]
  split, exposed, by_part = step_trace.wall_split(events, kernels, parts)
  assert split == {"matmul": 10, "other kernels only": 15, "no traced kernel": 5}
  assert by_part[("MLP (SwiGLU)", True)] == 5 + 2.5  # Alone 0-5, shared 5-10.
  assert by_part[("norms + RoPE", False)] == 2.5 + 5 + 10
  assert sum(by_part.values()) == split["matmul"] + split["other kernels only"]
  assert exposed == {"norm": 15}
