"""Schedules, Adafactor state layout, sharding fallbacks and the FLOP convention (no training)."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
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


def _stacked_problem():
  """Stacked and unstacked leaves whose layers differ in scale, so that per-layer RMS matters."""
  rng = np.random.default_rng(0)
  layer_scale = np.array([0.1, 1.0, 30.0], np.float32)
  params = {"w": rng.normal(size=(3, 256, 384)).astype(np.float32) * layer_scale[:, None, None],
            "n": rng.normal(size=(3, 16)).astype(np.float32) * layer_scale[:, None],
            "b": rng.normal(size=(256,)).astype(np.float32),
            "e": rng.normal(size=(300, 128)).astype(np.float32)}
  axes = {"w": ("layers", "embed", "mlp"), "n": ("layers", "kv"), "b": ("embed",),
          "e": ("vocab", "embed")}
  grads = [{k: (rng.normal(size=v.shape) * (1 + 5 * (v.ndim > 1 and k in "wn")
                                           * np.arange(v.shape[0]).reshape(-1, *[1] * (v.ndim - 1)))
                ).astype(np.float32) for k, v in params.items()} for _ in range(3)]
  return params, axes, grads


def _unstack(tree):
  out = {k: tree[k] for k in ("b", "e")}
  out.update({f"{k}{i}": tree[k][i] for k in ("w", "n") for i in range(3)})
  return out


def _run(tx, params, grads):
  state, updates = tx.init(params), []
  for g in grads:
    u, state = tx.update(g, state, params)
    params = optax.apply_updates(params, u)
    updates.append(u)
  return updates, state


def test_per_layer_adafactor_equals_optax_adafactor_on_each_layer():
  params, axes, grads = _stacked_problem()
  cfg = TrainConfig(clip_grad_norm=0)  # Global-norm clipping would couple the layers.
  per_layer, _ = _run(optimizer.make_optimizer(cfg, axes), params, grads)
  reference = optax.adafactor(learning_rate=None, momentum=None, decay_offset=0)
  ref, _ = _run(reference, _unstack(params), [_unstack(g) for g in grads])
  for got, want in zip(per_layer, ref):
    got = _unstack(got)
    for k in want:
      np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=1e-9, err_msg=k)
  # The whole-stack variant is optax.adafactor on the stacked arrays, and differs per layer.
  whole, _ = _run(optimizer.make_optimizer(dataclasses.replace(cfg, adafactor_per_layer=False),
                                           axes), params, grads)
  stacked_ref, _ = _run(reference, params, grads)
  for got, want in zip(whole, stacked_ref):
    for k in want:
      np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=1e-9, err_msg=k)
  for k in ("w0", "w2", "n0"):
    diff = np.abs(_unstack(whole[0])[k] - ref[0][k]).max() / np.abs(ref[0][k]).max()
    assert diff > 0.1, (k, diff)


def test_per_layer_adafactor_keeps_optax_state_layout():
  params, axes, _ = _stacked_problem()
  ours = jax.eval_shape(optimizer.make_optimizer(TrainConfig(), axes).init, params)
  theirs = jax.eval_shape(optax.chain(optax.clip_by_global_norm(1.0), optax.adafactor(
      learning_rate=None, momentum=None, decay_offset=0)).init, params)
  assert jax.tree.structure(ours) == jax.tree.structure(theirs)
  assert jax.tree.map(lambda x: x.shape, ours) == jax.tree.map(lambda x: x.shape, theirs)


def test_factored_dims_follow_optax():
  """The axes the factored statistics drop (for their logical axes): optax's rule."""
  shapes = {"factored": (256, 160), "factored_last": (3, 130, 192), "unfactored": (4, 130, 8, 64),
            "vector": (160,)}
  params = {k: jnp.zeros(s) for k, s in shapes.items()}
  state = optax.scale_by_factored_rms(factored=True, min_dim_size_to_factor=128).init(params)
  for k, shape in shapes.items():
    dims = optimizer.factored_dims(shape, 128)
    if dims is None:
      assert state.v[k].shape == shape and state.v_row[k].shape == (1,), k
    else:
      d1, d0 = dims
      assert state.v_row[k].shape == shape[:d0] + shape[d0 + 1:], k
      assert state.v_col[k].shape == shape[:d1] + shape[d1 + 1:], k
  assert optimizer.factored_dims(shapes["factored"], 128) == (1, 0)
  assert optimizer.factored_dims(shapes["factored_last"], 128) == (1, 2)


def test_fitted_spec_replicates_what_the_mesh_does_not_divide():
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape((1,) * len(partitioning.MESH_AXES)),
                           partitioning.MESH_AXES)
  spec = partitioning.fitted_spec(("layers", "embed", "mlp"), (3, 64, 128), mesh)
  assert spec == jax.sharding.PartitionSpec(None, ("expert", "fsdp"), "tensor")

  class FakeMesh:
    shape = {"dcn": 1, "data": 1, "expert": 1, "fsdp": 2, "tensor": 4}
  spec = partitioning.fitted_spec(("layers", "embed", "heads", "kv"), (3, 64, 6, 16), FakeMesh)
  assert spec == jax.sharding.PartitionSpec(None, ("expert", "fsdp"), None, None)


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


def test_refreshing_the_cpu_peak_probes_again_and_keeps_the_best(monkeypatch):
  key = "float32:1024"
  monkeypatch.setitem(flops._CPU_PEAK_CACHE, key, 1.0)  # A probe that read far too low...
  assert flops.measured_cpu_peak("float32") == 1.0  # ...is what the process uses...
  fresh = flops.measured_cpu_peak("float32", refresh=True)  # ...until a benchmark refreshes it.
  assert 1e9 < fresh < 1e13
  monkeypatch.setitem(flops._CPU_PEAK_CACHE, key, 1e15)  # Above any probe: kept.
  assert flops.measured_cpu_peak("float32", refresh=True) == 1e15
