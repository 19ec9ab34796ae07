"""The MoE capacity path on one device: with room for every pair it equals the dropless path
(forward and gradients); with less, the dropped pairs are the ones a direct count in token order
drops, counted in the stats, padding never taking a place, and the gradients are a dense
computation's."""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from t5like.models import moe
from t5like.models.moe_dispatch import capacity
from test_moe_layer import moe_cfg


def _pair(cfg, factor):
  """The same layer (same weights) on the dropless and on the capacity path."""
  dropless = moe.MoEFeedForward(cfg, rngs=nnx.Rngs(0))
  cap_cfg = dataclasses.replace(cfg, moe=dataclasses.replace(cfg.moe, capacity_factor=factor))
  capped = moe.MoEFeedForward(cap_cfg, rngs=nnx.Rngs(0))
  return dropless, capped


def test_capacity_with_room_for_all_equals_dropless_forward_and_gradients():
  cfg = moe_cfg(num_groups=1)
  dropless, capped = _pair(cfg, float(cfg.moe.num_experts))  # C = T * K: nothing can drop.
  x = jax.random.normal(jax.random.key(0), (2, 7, cfg.d_model))
  w = jax.random.normal(jax.random.key(1), (2, 7, cfg.d_model))
  outs = []
  for layer in (dropless, capped):
    graphdef, params, rest = nnx.split(layer, nnx.Param, ...)
    loss = lambda p, x: jnp.sum(nnx.merge(graphdef, p, rest)(x) * w)  # noqa: E731
    with moe.collect_stats():
      y = layer(x)
    outs.append((y, jax.grad(loss, argnums=(0, 1))(params, x)))
    assert float(layer.stats.get_value().dropped) == 0
  np.testing.assert_allclose(np.asarray(outs[1][0]), np.asarray(outs[0][0]), atol=1e-5)
  for a, b in zip(jax.tree.leaves(outs[1][1]), jax.tree.leaves(outs[0][1])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b),
                               atol=1e-5 * max(1.0, float(np.abs(np.asarray(b)).max())))


@pytest.mark.parametrize("factor", [0.5, 1.0])
def test_dropped_pairs_equal_a_direct_count(factor):
  cfg = moe_cfg(num_groups=1, num_shared_experts=0)
  dropless, capped = _pair(cfg, factor)
  b, t, e, k = 2, 9, cfg.moe.num_experts, cfg.moe.top_k
  x = jax.random.normal(jax.random.key(2), (b, t, cfg.d_model))
  valid = np.ones((b, t), bool)
  valid[1, 6:] = False  # Padding claims no place.
  with moe.collect_stats():
    got = np.asarray(capped(x, jnp.asarray(valid)))
  _, _, idx, gates = capped.route(x)
  idx, gates = np.asarray(idx).reshape(-1, k), np.asarray(gates).reshape(-1, k)
  cap = math.ceil(factor * b * t * k / e)
  assert cap == capacity(b * t, k, e, factor)
  used, kept, dropped = np.zeros(e, int), np.zeros_like(idx, bool), 0
  for n, real in enumerate(valid.reshape(-1)):  # Tokens in order, a token's slots in order.
    for j in range(k):
      if not real:
        continue
      if used[idx[n, j]] < cap:
        used[idx[n, j]] += 1
        kept[n, j] = True
      else:
        dropped += 1
  assert dropped > 0  # The capacity binds in this test.
  assert float(capped.stats.get_value().dropped) == dropped
  assert dropped == sum(max(0, c - cap) for c in np.asarray(capped.stats.get_value().load))
  # Output: each kept pair's expert output times its gate; dropped pairs give nothing.
  xs = np.asarray(x).reshape(-1, cfg.d_model)
  every = np.asarray(dropless.experts.dropless(
      jnp.asarray(np.repeat(xs, e, axis=0)), jnp.asarray(np.tile(np.arange(e), len(xs))[:, None]),
      0.0, None)).reshape(len(xs), e, -1)
  want = np.einsum("nk,nkd->nd", gates * kept, np.take_along_axis(every, idx[..., None], 1))
  np.testing.assert_allclose(got.reshape(len(xs), -1), want, atol=1e-5)


@pytest.mark.parametrize("factor", [0.5, 0.75])
def test_capacity_dispatch_gradients_with_drops_equal_a_dense_reference(factor):
  """The dispatch into the experts' buffers and the gather back differentiate like a dense
  computation, drops included: every expert on every token, each kept pair's row taken, dropped
  pairs and padding giving zero."""
  from t5like.models import moe_dispatch
  rng = np.random.default_rng(0)
  b, t, d, f, e, k = 2, 9, 8, 16, 4, 2
  x = jnp.asarray(rng.normal(size=(b, t, d)), jnp.float32)
  idx = jnp.asarray(np.stack([rng.choice(e, k, replace=False) for _ in range(b * t)])
                    .reshape(b, t, k), jnp.int32)
  valid = np.ones((b, t), bool)
  valid[1, 6:] = False
  weights = tuple(jnp.asarray(0.3 * rng.normal(size=s), jnp.float32)
                  for s in ((e, d, f), (e, d, f), (e, f, d)))
  w_out = jnp.asarray(rng.normal(size=(b, t, k, d)), jnp.float32)

  def capped(x, weights):
    y, kept = moe_dispatch.capacity_experts(x, idx, jnp.asarray(valid), weights, factor)
    return jnp.sum(y * w_out), kept

  def dense(x, weights, kept):
    every_etd = moe_dispatch._experts(
        jnp.broadcast_to(x.reshape(1, b * t, d), (e, b * t, d)), *weights)
    y_tkd = every_etd[idx.reshape(-1, k), jnp.arange(b * t)[:, None]]
    return jnp.sum(y_tkd.reshape(b, t, k, d) * kept[..., None] * w_out)

  (loss, kept), grads = jax.value_and_grad(capped, argnums=(0, 1), has_aux=True)(x, weights)
  kept = np.asarray(kept)
  assert not kept[valid].all() and not kept[~valid].any()  # Drops happen; padding keeps nothing.
  want, want_grads = jax.value_and_grad(dense, argnums=(0, 1))(x, weights, jnp.asarray(kept))
  np.testing.assert_allclose(float(loss), float(want), rtol=1e-5)
  for a, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(w),
                               atol=1e-5 * max(1.0, float(np.abs(np.asarray(w)).max())))


def test_capacity_dispatch_and_its_gradient_have_no_scatter():
  """Both ways, the dispatch moves rows with gathers (each direction's inverse is known): XLA:TPU
  compiles a scatter-add, a gather's own gradient, with a sort of its indices, hundreds of
  thousands of (token, expert) pairs a layer."""
  from t5like.models import moe_dispatch
  rng = np.random.default_rng(1)
  b, t, d, f, e, k = 2, 9, 8, 16, 4, 2
  x = jnp.asarray(rng.normal(size=(b, t, d)), jnp.float32)
  idx = jnp.asarray(np.stack([rng.choice(e, k, replace=False) for _ in range(b * t)])
                    .reshape(b, t, k), jnp.int32)
  weights = tuple(jnp.asarray(rng.normal(size=s), jnp.float32)
                  for s in ((e, d, f), (e, d, f), (e, f, d)))

  def loss(x, weights):
    y, _ = moe_dispatch.capacity_experts(x, idx, jnp.ones((b, t), bool), weights, 0.75)
    return jnp.sum(y ** 2)

  text = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(x, weights))
  assert "gather" in text
  assert "scatter" not in text, [ln for ln in text.splitlines() if "scatter" in ln]


def test_capacity_layer_gradient_has_no_scatter():
  """The whole layer on the capacity path (router, gate values, dispatch, shared expert): its
  gradient moves no row by a scatter, the gate's chosen scores included (``chosen_scores``)."""
  cfg = moe_cfg()
  cfg = dataclasses.replace(cfg, moe=dataclasses.replace(cfg.moe, capacity_factor=1.0))
  graphdef, params, rest = nnx.split(moe.MoEFeedForward(cfg, rngs=nnx.Rngs(0)), nnx.Param, ...)
  x = jax.random.normal(jax.random.key(1), (2, 6, cfg.d_model), jnp.float32)

  def loss(p, x):
    return jnp.sum(nnx.merge(graphdef, p, rest)(x) ** 2)

  text = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(params, x))
  assert "custom_vjp_call" in text
  assert "scatter" not in text, [ln for ln in text.splitlines() if "scatter" in ln]


@pytest.mark.parametrize("n,block", [(36, 256), (1000, 8), (70_003, 256)])
def test_running_count_equals_cumsum_exactly(n, block):
  """The capacity path's running counts (triangular products in bfloat16 with float32 sums) are
  ``cumsum`` exactly, across blocks and a ragged last block, up to counts far past bfloat16's
  256."""
  from t5like.models.moe_dispatch import running_count
  rng = np.random.default_rng(n)
  for chosen in ((rng.random((n, 6)) < 0.11).astype(np.int32), np.ones((n, 3), np.int32)):
    got = np.asarray(running_count(jnp.asarray(chosen), block=block))
    np.testing.assert_array_equal(got, np.cumsum(chosen, axis=0))
