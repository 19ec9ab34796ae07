"""MoE feed-forwards inside both families: which layers are MoE, packed rows with padding, scan
vs loop, parameter counts (total and active) and FLOPs of active experts only."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import forward, tiny_cfg, tokens
from t5like.config.moe import moe_layer_flags
from t5like.models import build_model, moe
from t5like.models.param_count import analytic_param_count, built_param_count
from t5like.training import flops


def moe_model_cfg(family, **moe_overrides):
  cfg = tiny_cfg(family, num_layers=3, num_encoder_layers=2, num_decoder_layers=2)
  for k, v in {**dict(num_experts=4, top_k=2, expert_d_ff=16, num_shared_experts=1),
               **moe_overrides}.items():
    setattr(cfg.moe, k, v)
  return cfg.validate()


def test_layer_patterns():
  assert moe_layer_flags(5, "all", 0) == (True,) * 5
  assert moe_layer_flags(5, "all", 2) == (False, False, True, True, True)
  assert moe_layer_flags(6, "every_other", 1) == (False, True, False, True, False, True)
  assert moe_layer_flags(3, "none", 0) == (False,) * 3


@pytest.mark.parametrize("family,overrides,want", [
    ("decllm", dict(decoder_first_dense=1), {"decoder": [False, True, True]}),
    ("decllm", dict(decoder_layers="every_other"), {"decoder": [True, False, True]}),
    ("redllm", dict(encoder_layers="none"), {"encoder": [False, False],
                                              "decoder": [True, True]}),
    ("redllm", dict(decoder_first_dense=1, encoder_layers="every_other"),
     {"encoder": [True, False], "decoder": [False, True]})])
def test_the_configured_layers_are_moe(family, overrides, want):
  model = build_model(moe_model_cfg(family, **overrides), nnx.Rngs(0))
  for stack, flags in want.items():
    names = moe.moe_layer_names(model)
    got = sorted(int(n.split("/")[1]) for ns in names.values() for n in ns
                 if n.startswith(stack))
    assert got == [i for i, f in enumerate(flags) if f], (stack, names)


def _two_examples(family):
  """Two examples (lengths 4 and 3) packed in one row with 1 padding token, and the same two
  examples each alone in its own row (padded)."""
  a, b = tokens((4,), seed=1), tokens((3,), seed=2)
  pad = lambda x, n: jnp.concatenate([x, jnp.zeros(n - len(x), jnp.int32)])  # noqa: E731
  seg = jnp.array([[1, 1, 1, 1, 2, 2, 2, 0]])
  pos = jnp.array([[0, 1, 2, 3, 0, 1, 2, 0]])
  packed = {"decoder_input_tokens": pad(jnp.concatenate([a, b]), 8)[None],
            "decoder_segment_ids": seg, "decoder_positions": pos}
  single = {"decoder_input_tokens": jnp.stack([pad(a, 8), pad(b, 8)]),
            "decoder_segment_ids": jnp.array([[1] * 4 + [0] * 4, [1] * 3 + [0] * 5]),
            "decoder_positions": jnp.array([list(range(8))] * 2)}
  if family == "redllm":  # Same encoder input per example; decoder positions continue after it.
    e1, e2 = tokens((3,), seed=3), tokens((2,), seed=4)
    packed.update(encoder_input_tokens=pad(jnp.concatenate([e1, e2]), 6)[None],
                  encoder_segment_ids=jnp.array([[1, 1, 1, 2, 2, 0]]),
                  encoder_positions=jnp.array([[0, 1, 2, 0, 1, 0]]),
                  decoder_positions=jnp.array([[3, 4, 5, 6, 2, 3, 4, 0]]))
    single.update(encoder_input_tokens=jnp.stack([pad(e1, 6), pad(e2, 6)]),
                  encoder_segment_ids=jnp.array([[1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]]),
                  encoder_positions=jnp.array([list(range(6))] * 2),
                  decoder_positions=jnp.array([list(range(3, 11)), list(range(2, 10))]))
  return packed, single


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_packed_rows_with_padding_equal_separate_rows_and_loads_skip_padding(family):
  """Dropless routing is per token: packing examples together changes no output and no load."""
  cfg = moe_model_cfg(family, decoder_first_dense=0)
  model = build_model(cfg, nnx.Rngs(0))
  packed, single = _two_examples(family)
  got, want = forward(model, packed), forward(model, single)
  np.testing.assert_allclose(np.asarray(got[0, :4]), np.asarray(want[0, :4]), atol=1e-5)
  np.testing.assert_allclose(np.asarray(got[0, 4:7]), np.asarray(want[1, :3]), atol=1e-5)

  @nnx.jit
  def loads(model, batch):
    with moe.collect_stats():
      model(batch)
    return {"/".join(map(str, k)): v.load for k, v in moe.pop_layer_stats(model).items()}
  lp, ls = loads(model, packed), loads(model, single)
  for k in lp:
    np.testing.assert_array_equal(np.asarray(lp[k]), np.asarray(ls[k]))
    real = 7 if "decoder" in k else 5
    np.testing.assert_array_equal(np.asarray(lp[k]).sum(-1), cfg.moe.top_k * real)


@pytest.mark.slow  # make test's 15-minute budget on 2 cores (docs/tests.md)
@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_scan_and_loop_give_the_same_logits_and_gradients(family):
  cfg = moe_model_cfg(family, decoder_layers="every_other", encoder_first_dense=1)
  batch = {"decoder_input_tokens": tokens((2, 6)), "encoder_input_tokens": tokens((2, 5))}
  outs = []
  for scan in (True, False):
    model = build_model(dataclasses.replace(cfg, scan_layers=scan), nnx.Rngs(0))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    loss = lambda p: jnp.sum(nnx.merge(graphdef, p, rest)(batch) ** 2)  # noqa: E731
    outs.append((forward(model, batch), jax.grad(loss)(params)))
  np.testing.assert_allclose(np.asarray(outs[0][0]), np.asarray(outs[1][0]), atol=1e-5)
  for a, b in zip(jax.tree.leaves(outs[0][1]), jax.tree.leaves(outs[1][1])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4 * max(
        1.0, float(np.abs(np.asarray(b)).max())))


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_parameter_counts_total_and_active(family):
  cfg = moe_model_cfg(family, decoder_first_dense=1, num_shared_experts=2)
  assert built_param_count(cfg) == analytic_param_count(cfg)
  d, f, e, k, s = cfg.d_model, 16, 4, 2, 2
  n_moe = 2 if family == "decllm" else 2 + 1  # DecLLM: layers 1, 2; RedLLM: 2 enc + dec 1.
  dense = dataclasses.replace(cfg, moe=dataclasses.replace(cfg.moe, num_experts=0))
  dense_ffn = 3 * d * cfg.d_ff
  total = analytic_param_count(dense) + n_moe * (d * e + (e + s) * 3 * d * f - dense_ffn)
  active = analytic_param_count(dense) + n_moe * (d * e + (k + s) * 3 * d * f - dense_ffn)
  assert analytic_param_count(cfg) == total
  assert analytic_param_count(cfg, active=True) == active


def test_flops_count_only_active_experts():
  cfg = moe_model_cfg("redllm", decoder_first_dense=1)
  dense = dataclasses.replace(cfg, moe=dataclasses.replace(cfg.moe, num_experts=0))
  b, sd, se, d = 2, 8, 6, cfg.d_model
  moe_ffn = lambda s: 6 * b * s * d * (2 + 1) * 16 + 2 * b * s * d * 4  # noqa: E731
  dense_ffn = lambda s: 6 * b * s * d * cfg.d_ff  # noqa: E731
  want = (flops.forward_flops(dense, b, sd, se) + 2 * (moe_ffn(se) - dense_ffn(se))
          + (moe_ffn(sd) - dense_ffn(sd)))
  assert flops.forward_flops(cfg, b, sd, se) == pytest.approx(want, rel=1e-12)


def test_expert_weights_carry_logical_axes_of_the_rule_table():
  from t5like import partitioning
  model = build_model(moe_model_cfg("redllm", encoder_layers="every_other"), nnx.Rngs(0))
  known = {name for name, _ in partitioning.LOGICAL_RULES}
  seen = {}
  for path, var in nnx.to_flat_state(nnx.state(model, (nnx.Param, moe.RouterBias))):
    axes = var.get_metadata()["out_sharding"]
    assert len(axes) == var.get_value().ndim and set(axes) <= known, (path, axes)
    seen[path[-2:]] = axes
  assert seen[("experts", "wi_gate")] == ("layers", "expert", "embed", "mlp")
  assert seen[("experts", "wo")] == ("layers", "expert", "mlp", "embed")
  assert seen[("router", "kernel")] == ("layers", "embed", "expert")
  assert seen[("router", "bias")] == ("layers", "expert")
