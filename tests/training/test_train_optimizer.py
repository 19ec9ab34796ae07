"""Schedules, Adafactor state layout, sharding fallbacks and the FLOP convention (no training)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5like import partitioning
from t5like.config import ModelConfig, TrainConfig
from t5like.training import flops, optimizer


def test_warmup_cosine_schedule_matches_the_paper_shape():
  cfg = TrainConfig(steps=400_000, warmup_steps=2000, learning_rate=0.01, final_lr_fraction=0.1)
  lr = optimizer.learning_rate_schedule(cfg)
  assert float(lr(0)) == 0.0
  assert float(lr(1000)) == pytest.approx(0.005, rel=1e-6)
  assert float(lr(2000)) == pytest.approx(0.01, rel=1e-6)
  mid = 2000 + (400_000 - 2000) // 2
  assert float(lr(mid)) == pytest.approx(0.001 + 0.009 * 0.5, rel=1e-4)
  assert float(lr(400_000)) == pytest.approx(0.001, rel=1e-6)
  assert float(lr(500_000)) == pytest.approx(0.001, rel=1e-6)


def test_constant_schedule_and_short_runs():
  lr = optimizer.learning_rate_schedule(TrainConfig(schedule="constant", learning_rate=1e-3))
  assert float(lr(0)) == float(lr(10**6)) == pytest.approx(1e-3)
  short = optimizer.learning_rate_schedule(TrainConfig(steps=5, warmup_steps=10))
  assert np.all(np.isfinite([float(short(i)) for i in range(12)]))


def test_factored_state_axes_follow_the_parameter():
  params = {"w": jnp.zeros((2, 256, 512)), "b": jnp.zeros((256,)), "n": jnp.zeros((2, 16))}
  axes = {"w": ("layers", "embed", "mlp"), "b": ("embed",), "n": ("layers", "kv")}
  tx = optimizer.make_optimizer(TrainConfig())
  state = jax.eval_shape(tx.init, params)
  opt_axes = optimizer.optimizer_state_axes(state, params, axes, 128)
  flat, treedef = jax.tree_util.tree_flatten_with_path(state)
  leaves = {jax.tree_util.keystr(p): a for (p, _), a in zip(flat,
                                                             treedef.flatten_up_to(opt_axes))}
  row = [a for k, a in leaves.items() if "v_row" in k and "'w'" in k]
  col = [a for k, a in leaves.items() if "v_col" in k and "'w'" in k]
  full = [a for k, a in leaves.items() if ".v" in k and "v_" not in k and "'b'" in k]
  # w [2, 256, 512]: v_row drops the largest dim (mlp), v_col the second largest (embed).
  assert row == [("layers", "embed")] and col == [("layers", "mlp")]
  assert full == [("embed",)]


def test_fitted_spec_replicates_what_the_mesh_does_not_divide():
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1), ("data", "fsdp",
                                                                           "tensor"))
  spec = partitioning.fitted_spec(("layers", "embed", "mlp"), (3, 64, 128), mesh)
  assert spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")

  class FakeMesh:
    shape = {"data": 1, "fsdp": 2, "tensor": 4}
  spec = partitioning.fitted_spec(("layers", "embed", "heads", "kv"), (3, 64, 6, 16), FakeMesh)
  assert spec == jax.sharding.PartitionSpec(None, "fsdp", None, None)


def test_flops_follow_paper_convention():
  cfg = ModelConfig(family="decllm", vocab_size=100, d_model=8, num_heads=2, head_dim=4, d_ff=32,
                    num_layers=3)
  b, s = 2, 10
  layer = (6 * b * s * 8 * 32 + 2 * b * s * 8 * (2 + 2 * 2) * 4 + 2 * b * s * 8 * 2 * 4
           + 4 * b * s * s * 2 * 4 / 2)
  expected = 3 * layer + 2 * b * s * 8 * 100
  assert flops.forward_flops(cfg, b, s) == pytest.approx(expected)
  assert flops.train_flops(cfg, b, s) == pytest.approx(3 * expected)
  red = ModelConfig(family="redllm", vocab_size=100, d_model=8, num_heads=2, head_dim=4, d_ff=32,
                    num_encoder_layers=2, num_decoder_layers=1)
  se, sd = 6, 4
  enc = (6 * b * se * 8 * 32 + 2 * b * se * 8 * 6 * 4 + 2 * b * se * 8 * 2 * 4
         + 4 * b * se * se * 2 * 4)
  dec = (6 * b * sd * 8 * 32 + 2 * b * sd * 8 * 6 * 4 + 2 * b * sd * 8 * 2 * 4
         + 4 * b * sd * sd * 2 * 4 / 2
         + 2 * b * sd * 8 * 2 * 4 + 2 * b * se * 8 * 4 * 4 + 2 * b * sd * 8 * 2 * 4
         + 4 * b * sd * se * 2 * 4)
  assert flops.forward_flops(red, b, sd, se) == pytest.approx(
      2 * enc + dec + 2 * b * sd * 8 * 100)


def test_peak_lookup_and_the_cpu_peak_is_measured_here():
  assert flops.peak_flops_per_device(123.0, "bfloat16") == 123.0
  probe = flops.measured_cpu_peak("float32")
  assert flops.peak_flops_per_device(0.0, "float32") == pytest.approx(
      probe / jax.local_device_count())
  assert flops.measured_cpu_peak("float32") == probe  # Once per process.
  # A plain matmul on any x86 core does between 1 GFLOP/s and 10 TFLOP/s: a measurement, not
  # the old 569 GFLOP/s constant of one CPU type.
  assert 1e9 < probe < 1e13
