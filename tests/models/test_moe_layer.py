"""The MoE feed-forward against independent transcriptions: the gate in numpy on hand-made
affinities (ties, bias, groups), the layer against every token through every expert."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import tiny_cfg
from t5like.config import ConfigError
from t5like.models import moe


def np_route(s, b, k, groups=1, top_groups=1, scaling=1.0):
  """The DeepSeek-V3 gate, written from its definition: ties go to the lower index."""
  s, b = np.asarray(s, np.float64), np.asarray(b, np.float64)
  choice = s + b
  idx, gates = [], []
  for row_s, row_c in zip(s, choice):
    allowed = np.ones(len(row_c), bool)
    if groups > 1:
      per = len(row_c) // groups
      gscore = [np.sort(row_c[g * per:(g + 1) * per])[::-1][:2].sum() for g in range(groups)]
      best = np.argsort(-np.asarray(gscore), kind="stable")[:top_groups]
      allowed[:] = False
      for g in best:
        allowed[g * per:(g + 1) * per] = True
    cand = np.where(allowed, row_c, -np.inf)
    top = np.argsort(-cand, kind="stable")[:k]
    idx.append(top)
    gates.append(scaling * row_s[top] / row_s[top].sum())
  return np.asarray(idx), np.asarray(gates)


# Hand-made affinities (exact binary fractions) with ties inside and across groups.
S = np.array([[0.5, 0.25, 0.5, 0.125, 0.75, 0.75, 0.0625, 0.5],
              [0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25],
              [0.125, 0.875, 0.5, 0.5, 0.875, 0.125, 0.5, 0.5],
              [0.9375, 0.0625, 0.0625, 0.0625, 0.5, 0.5, 0.5, 0.5]], np.float32)
B0 = np.zeros(8, np.float32)
B1 = np.array([0.0, 0.5, -0.25, 0.0, -0.5, 0.0, 0.5, 0.0], np.float32)


@pytest.mark.parametrize("bias", [B0, B1], ids=["no_bias", "bias"])
@pytest.mark.parametrize("k,groups,top_groups", [(1, 1, 1), (2, 1, 1), (3, 1, 1), (2, 4, 2),
                                                  (2, 2, 1), (3, 4, 3)])
def test_gate_equals_numpy_transcription(bias, k, groups, top_groups):
  idx = moe.select_experts(jnp.asarray(S), jnp.asarray(bias), k, groups, top_groups)
  gates = moe.gate_values(jnp.asarray(S), idx, 2.5)
  want_idx, want_gates = np_route(S, bias, k, groups, top_groups, 2.5)
  np.testing.assert_array_equal(np.asarray(idx), want_idx)
  np.testing.assert_allclose(np.asarray(gates), want_gates, rtol=1e-6)


def test_bias_moves_selection_not_gate_values():
  idx0 = moe.select_experts(jnp.asarray(S), jnp.asarray(B0), 2)
  idx1 = moe.select_experts(jnp.asarray(S), jnp.asarray(B1), 2)
  assert not np.array_equal(np.asarray(idx0), np.asarray(idx1))
  g1 = np.asarray(moe.gate_values(jnp.asarray(S), idx1, 1.0))
  s_chosen = np.take_along_axis(S, np.asarray(idx1), axis=1)
  np.testing.assert_allclose(g1, s_chosen / s_chosen.sum(1, keepdims=True), rtol=1e-6)
  np.testing.assert_allclose(g1.sum(1), 1.0, rtol=1e-6)


def moe_cfg(**moe_overrides):
  cfg = tiny_cfg("decllm")
  for key, val in dict(num_experts=8, num_shared_experts=1, top_k=2, expert_d_ff=16,
                       num_groups=4, top_groups=2, routed_scaling=1.5).items():
    setattr(cfg.moe, key, val)
  for key, val in moe_overrides.items():
    setattr(cfg.moe, key, val)
  return cfg.validate()


def brute_force(params, x_btd, bias, cfg):
  """Every token through every expert in float64, combined with the numpy gate's top-K."""
  m = cfg.moe
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  x = np.asarray(x_btd, np.float64)
  silu = lambda z: z / (1 + np.exp(-z))  # noqa: E731
  s = 1 / (1 + np.exp(-x @ p["router"]["kernel"]))
  idx, gates = np_route(s.reshape(-1, m.num_experts), bias, m.top_k, m.num_groups, m.top_groups,
                        m.routed_scaling)
  e = p["experts"]
  every = np.stack([(silu(x @ e["wi_gate"][i]) * (x @ e["wi_up"][i])) @ e["wo"][i]
                    for i in range(m.num_experts)], axis=2)  # [b, t, E, d]
  every = every.reshape(-1, m.num_experts, x.shape[-1])
  routed = np.einsum("tk,tkd->td", gates, np.take_along_axis(every, idx[:, :, None], axis=1))
  sh = p["shared"]
  shared = (silu(x @ sh["wi_gate"]) * (x @ sh["wi_up"])) @ sh["wo"]
  return routed.reshape(x.shape) + shared, idx


def _layer(cfg, seed=0):
  layer = moe.MoEFeedForward(cfg, rngs=nnx.Rngs(seed))
  bias = np.random.RandomState(seed).uniform(-0.3, 0.3, cfg.moe.num_experts).astype(np.float32)
  layer.router.bias.set_value(jnp.asarray(bias))
  return layer, bias


@pytest.mark.parametrize("overrides", [{}, dict(num_groups=1, top_k=3, num_shared_experts=0)],
                         ids=["groups+shared", "plain"])
def test_layer_equals_brute_force_forward_and_gradients(overrides):
  cfg = moe_cfg(**overrides)
  layer, bias = _layer(cfg)
  x = jax.random.normal(jax.random.key(1), (3, 5, cfg.d_model), jnp.float32)
  graphdef, params, rest = nnx.split(layer, nnx.Param, ...)
  pure = nnx.to_pure_dict(params)
  if "shared" not in pure:
    pure["shared"] = {k: np.zeros((cfg.d_model, 1) if k != "wo" else (1, cfg.d_model))
                      for k in ("wi_gate", "wi_up", "wo")}
  want, idx = brute_force(pure, x, bias, cfg)
  got = layer(x)
  scale = np.abs(want).max()
  np.testing.assert_allclose(np.asarray(got), want, atol=2e-6 * scale, rtol=0)

  # Gradients: the layer vs the same every-expert reference in jax (float32), the top-K fixed
  # by the numpy gate (selection has no gradient; the gate values and experts do).
  w_out = jax.random.normal(jax.random.key(2), got.shape)
  idx = jnp.asarray(idx.reshape(x.shape[0], x.shape[1], -1))

  def reference(p, x):
    s = jax.nn.sigmoid(x @ p["router"]["kernel"])
    s_k = jnp.take_along_axis(s, idx, axis=-1)
    g = cfg.moe.routed_scaling * s_k / s_k.sum(-1, keepdims=True)
    e = p["experts"]
    every = jnp.stack([(jax.nn.silu(x @ e["wi_gate"][i]) * (x @ e["wi_up"][i])) @ e["wo"][i]
                       for i in range(cfg.moe.num_experts)], axis=2)
    y = jnp.einsum("btk,btkd->btd", g, jnp.take_along_axis(every, idx[..., None], axis=2))
    if "shared" in p:
      sh = p["shared"]
      y = y + (jax.nn.silu(x @ sh["wi_gate"]) * (x @ sh["wi_up"])) @ sh["wo"]
    return jnp.sum(y * w_out)

  def through_layer(p, x):
    return jnp.sum(nnx.merge(graphdef, p, rest)(x) * w_out)

  params_only = nnx.to_pure_dict(params)
  g_ref = jax.grad(reference, argnums=(0, 1))(params_only, x)
  g_got = jax.grad(through_layer, argnums=(0, 1))(params_only, x)
  for ref, got_ in zip(jax.tree.leaves(g_ref), jax.tree.leaves(g_got)):
    np.testing.assert_allclose(np.asarray(got_), np.asarray(ref),
                               atol=2e-5 * float(np.abs(ref).max()), rtol=0)


def test_stats_count_only_real_tokens():
  cfg = moe_cfg(num_groups=1)
  layer, _ = _layer(cfg)
  x = jax.random.normal(jax.random.key(3), (2, 6, cfg.d_model), jnp.float32)
  valid = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], bool)
  with moe.collect_stats():
    layer(x, jnp.asarray(valid))
  stats = layer.stats.get_value()
  logits = np.asarray(layer.router(x), np.float64)
  _, _, idx, _ = layer.route(x)
  idx = np.asarray(idx)
  load = np.zeros(cfg.moe.num_experts)
  for b, t in zip(*np.nonzero(valid)):
    for i in idx[b, t]:
      load[i] += 1
  np.testing.assert_array_equal(np.asarray(stats.load), load)
  assert float(stats.tokens) == valid.sum()
  s = 1 / (1 + np.exp(-logits))
  e, k = cfg.moe.num_experts, cfg.moe.top_k
  bal = []
  for b in range(2):
    rows = valid[b]
    f = np.zeros(e)
    for i in idx[b][rows].reshape(-1):
      f[i] += 1
    f *= e / (k * rows.sum())
    p = (s[b][rows] / s[b][rows].sum(-1, keepdims=True)).mean(0)
    bal.append((f * p).sum())
  np.testing.assert_allclose(float(stats.balance_loss), np.mean(bal), rtol=1e-5)
  lse = np.log(np.exp(logits).sum(-1))
  np.testing.assert_allclose(float(stats.z_loss), (lse[valid] ** 2).mean(), rtol=1e-5)


@pytest.mark.parametrize("overrides,needle", [
    (dict(top_k=9), "top_k"), (dict(num_groups=3), "num_groups"),
    (dict(num_groups=8), "fewer than 2"), (dict(top_groups=5), "top_groups"),
    (dict(num_groups=4, top_groups=1, top_k=3), "exceeds"),
    (dict(decoder_first_dense=3), "exceeds the 2"),
    (dict(decoder_layers="none"), "no layer is MoE"), (dict(expert_d_ff=0), "expert_d_ff"),
    (dict(decoder_layers="alternate"), "decoder_layers"), (dict(bias_update_rate=-1.0), "bias")])
def test_config_rejects_impossible_settings(overrides, needle):
  with pytest.raises(ConfigError, match=needle):
    moe_cfg(**overrides)


def test_override_parser_reaches_moe_fields():
  from t5like.config import Config, apply_overrides
  cfg = Config()
  apply_overrides(cfg, ["model.moe.num_experts=16", "model.moe.top_k=4",
                        "model.moe.decoder_layers=every_other", "model.moe.balance_loss=0.001"])
  assert (cfg.model.moe.num_experts, cfg.model.moe.top_k) == (16, 4)
  assert cfg.model.moe.decoder_layers == "every_other" and cfg.model.moe.balance_loss == 1e-3
  cfg.model.validate()
  with pytest.raises(ConfigError, match="no field 'experts'"):
    apply_overrides(cfg, ["model.moe.experts=3"])
