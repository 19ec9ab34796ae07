"""The decode step's fused CPU kernels (t5like/kernels/): greedy argmax, few-row products with
their neighbours (RMSNorm, a factor, SwiGLU gating, a residual add), and a self-attention step
(norms, RoPE, cache writes, attention) in one call.

Each against float64 (or jnp.argmax's exact result) on any CPU; the decode step of both families
must call them where they apply (the cached-logits tests then check its values end to end).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import tiny_model
from numerics import assert_close_to_scale
from t5like.inference import generation as gen
from t5like.inference import steps
from t5like.inference.sampling import SamplingConfig, sample
from t5like.kernels import argmax as cpu_argmax
from t5like.kernels import cache_attention, few_row, library
from t5like.models.rotary import rotary_table

pytestmark = pytest.mark.backends("cpu")  # XLA:CPU kernels (conftest.py).

EPS32 = float(np.finfo(np.float32).eps)


def _calls(fn, *args, name: str) -> int:
  return jax.jit(fn).lower(*args).as_text().count(name)


def test_argmax_kernel_is_jnp_argmax(kernels, monkeypatch):
  """First maximum on ties, the first NaN where a row has one, rows of -inf, any width."""
  rng = np.random.default_rng(0)
  for shape in [(8, 8192), (3, 97), (2, 5), (1, 8)]:
    x = rng.standard_normal(shape).astype(np.float32)
    if shape == (3, 97):
      x[0, 90] = x[0, 3] = 9.0  # Tie: index 3, in the first vector.
      x[1, 50] = np.nan
      x[1, 96] = np.nan  # NaNs: the first one.
      x[2] = -np.inf
    if shape == (8, 8192):
      x[5, 8191] = np.inf  # In the last vector.
      x[6, 4000] = x[6, 7000] = 99.0
    assert cpu_argmax.applies(jnp.asarray(x))
    got = jax.jit(cpu_argmax.argmax)(x)
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(got, jnp.argmax(x, axis=-1))
  logits = jnp.asarray(rng.standard_normal((4, 97)), jnp.float32)
  greedy = lambda x: sample(x, None, SamplingConfig())  # noqa: E731
  assert _calls(greedy, logits, name=library.ARGMAX) == 1
  assert _calls(greedy, logits.astype(jnp.bfloat16), name=library.ARGMAX) == 1  # Upcast first.
  monkeypatch.setenv(library.ENV_SWITCH, "0")  # Read when traced: a new function.
  assert _calls(lambda x: sample(x, None, SamplingConfig()), logits, name=library.ARGMAX) == 0


def _rms_norm64(x, scale, eps):
  x = np.asarray(x, np.float64)
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * np.asarray(scale, np.float64)


@pytest.mark.parametrize("m,n,k", [(1, 64, 8), (8, 2816, 512), (9, 66, 136), (3, 1000, 64)])
def test_fused_few_row_kernel_is_norm_factor_product_gating_residual(kernels, m, n, k):
  rng = np.random.default_rng(m + n + k)
  x = (rng.standard_normal((m, k)) * rng.uniform(0.1, 30, (m, 1))).astype(np.float32)
  scale = rng.uniform(0.5, 1.5, k).astype(np.float32)
  w = (rng.standard_normal((n, k)) * rng.uniform(0.1, 4, (n, 1))).astype(np.float32)
  h = _rms_norm64(x, scale, 1e-6)
  fused = jax.jit(lambda x, scale, w, glu: few_row.fused_matmul(x, w, norm_scale=scale, eps=1e-6,
                                                                glu=glu), static_argnums=3)
  y = np.asarray(fused(x, scale, w, False))
  ref, bound = h @ np.asarray(w, np.float64).T, np.abs(h) @ np.abs(w.astype(np.float64)).T
  # The product's float32 bound plus the norm's own rounding (a few ulps of each input).
  assert np.all(np.abs(y - ref) <= (2 * k + 8) * EPS32 * bound + 1e-30)
  residual = rng.standard_normal((m, n)).astype(np.float32) * 50
  plus = np.asarray(jax.jit(lambda x, s, w, r: few_row.fused_matmul(
      x, w, norm_scale=s, eps=1e-6, factor=0.125, residual=r))(x, scale, w, residual))
  assert np.all(np.abs(plus - (residual + 0.125 * ref)) <=
                (2 * k + 8) * EPS32 * 0.125 * bound + EPS32 * np.abs(residual) + 1e-30)
  if n % 2:
    return
  gated = np.asarray(fused(x, scale, w, True))
  g, u = ref[:, :n // 2], ref[:, n // 2:]
  want = g / (1 + np.exp(-g)) * u
  assert gated.shape == (m, n // 2)
  assert_close_to_scale(gated, want)
  deep = g < -12  # sigmoid(g) ~ exp(g): computed without cancellation, to float32's precision.
  assert np.all(np.abs(gated[deep] - want[deep]) <= 1e-3 * np.abs(want[deep]) + 1e-30)


def _attention_step64(qkv, scales, eps, rope, k, v, slot, valid):
  """float64: split, RMSNorm per head, RoPE, the new key/value into the caches, softmax."""
  b, g, s, d = k.shape
  y = np.asarray(qkv, np.float64).reshape(b, -1, d)
  h = y.shape[1] - 2 * g
  q, kn, vn = y[:, :h], y[:, h:h + g], y[:, h + g:]
  if scales is not None:
    q, kn, vn = (_rms_norm64(a, sc, eps) for a, sc in zip((q, kn, vn), scales))
  if rope is not None:
    sin, cos = (np.asarray(a, np.float64)[:, None, :] for a in rope)

    def rotate(a):
      a1, a2 = a[..., :d // 2], a[..., d // 2:]
      return np.concatenate([a1 * cos - a2 * sin, a2 * cos + a1 * sin], axis=-1)
    q, kn = rotate(q), rotate(kn)
  k, v = np.array(k, np.float64), np.array(v, np.float64)
  k[:, :, slot], v[:, :, slot] = kn, vn
  scores = np.einsum("bgrd,bgsd->bgrs", q.reshape(b, g, h // g, d) * d ** -0.5, k)
  mask = np.asarray(valid)[:, None, None, :]
  e = np.where(mask, np.exp(np.where(mask, scores, -np.inf) -
                            np.max(np.where(mask, scores, -np.inf), -1, keepdims=True)), 0.0)
  return np.einsum("bgrs,bgsd->bgrd", e / e.sum(-1, keepdims=True), v), k, v


@pytest.mark.parametrize("norm,rope,h,g,d", [(True, True, 4, 2, 64), (False, True, 8, 8, 8),
                                             (True, False, 3, 1, 16)])
def test_attention_step_kernel_equals_its_composition(kernels, norm, rope, h, g, d):
  b, s, slot = 3, 21, 13
  rng = np.random.default_rng(h * g * d)
  qkv = (rng.standard_normal((b, (h + 2 * g) * d)) * 3).astype(np.float32)
  scales = rng.uniform(0.5, 1.5, (3, d)).astype(np.float32) if norm else None
  table = rotary_table(jnp.asarray([[5], [17], [300]]), d, 10_000.0)
  rope_2bh = np.stack([np.asarray(table.sin).reshape(b, -1),
                       np.asarray(table.cos).reshape(b, -1)]) if rope else None
  k, v = (rng.standard_normal((b, g, s, d)).astype(np.float32) for _ in range(2))
  valid = rng.random((b, s)) < 0.6
  valid[:, slot] = True
  valid[1] = False
  valid[1, slot] = True  # Only the new token.
  qkv_j = jnp.asarray(qkv)
  assert cache_attention.step_applies(qkv_j, jnp.asarray(k), jnp.asarray(v))
  out, k_new, v_new = jax.jit(cache_attention.attend_step, static_argnums=(2,))(
      qkv_j, scales, 1e-6, rope_2bh, k, v, slot, valid)
  want_out, want_k, want_v = _attention_step64(qkv, scales, 1e-6, rope_2bh, k, v, slot, valid)
  assert out.shape == (b, g, h // g, d)
  assert_close_to_scale(out, want_out)
  for got, want, old in ((k_new, want_k, k), (v_new, want_v, v)):
    assert_close_to_scale(np.asarray(got)[:, :, slot], want[:, :, slot])
    others = np.arange(s) != slot
    np.testing.assert_array_equal(np.asarray(got)[:, :, others], old[:, :, others])


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_decode_step_runs_on_the_fused_kernels(kernels, family):
  """In the CPU layout every layer is four fused few-row calls (norm and q | k | v; output
  product and residual; norm, gate | up and gating; down and residual) and one attention step
  (RedLLM: and its cross-attention's query and output products), and the logits one more
  fused call (final norm, factor, table)."""
  layers = 3
  model = tiny_model(family, seed=0, **{"num_layers" if family == "decllm" else
                                        "num_decoder_layers": layers})
  prompts = [[5, 6, 7], [8, 9]]
  tokens, lens = gen._pad_inputs(prompts, family, len(prompts))
  plan = gen._Plan(family, tokens.shape[1], 2, -1, SamplingConfig())
  graphdef = nnx.graphdef(model)

  def one_step(params, tokens, lens):
    mdl = nnx.merge(graphdef, params)
    first, cache, step = gen._prefill(mdl, steps.decode_weights(mdl, transpose=True), plan,
                                      tokens, lens)
    return first, step(jnp.ones(len(prompts), jnp.int32), 1, cache)[0]  # Nothing left dead.

  compiled = jax.jit(one_step).lower(nnx.to_pure_dict(nnx.state(model)), tokens, lens).compile()
  text = compiled.as_text()  # Compiled: every call inlined, each named once.
  steps_run = 1 if family == "decllm" else 2  # RedLLM's prefill runs the BOS step too.
  assert text.count(library.ATTENTION_STEP) == steps_run * layers
  per_layer = 4 if family == "decllm" else 5  # RedLLM: + the cross-attention output + residual.
  queries = (family == "redllm") * layers  # RedLLM's cross-attention query: a plain product.
  assert text.count(library.FEW_ROW_FUSED) == steps_run * (per_layer * layers + 1 + queries)
