"""The ``xla`` / ``xla_cpu`` backends' rewritten forms (t5like/ops) in detail, beyond the op-by-op
equality of tests/models/test_ops_seam.py: the additive mask bias vs masking scores and
probabilities, the float32 logits matmul vs the plain dot (float64 kept), the RoPE table made once
per forward vs sin/cos in every layer, causal query blocks vs the whole softmax (and that they
skip keys), the RMSNorm VJP vs autodiff in float64 — float32 to reordering tolerance, bfloat16
within 2e-2 of the float32 result's scale."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import tiny_model, tokens
from numerics import assert_close_to_scale, assert_trees_close_to_scale
from t5like.models import decllm, masks, norms, redllm
from t5like.models.losses import cross_entropy_with_z_loss
from t5like.models.rotary import apply_rope
from t5like.ops import xla
from t5like.ops.reference import NEG_INF
from t5like.ops.xla import attention_weights
from t5like.ops import xla_cpu
from t5like.ops.xla_cpu import XlaCpu

XLA = xla.Xla()


def _where_weights(q, k, mask):
  """The previous form: masked scores, softmax, masked probabilities."""
  b, t, h, d = q.shape
  g = k.shape[2]
  qr = q.reshape(b, t, g, h // g, d) * jnp.asarray(d ** -0.5, q.dtype)
  s = jnp.einsum("btgrk,bsgk->bgrts", qr, k, preferred_element_type=jnp.float32)
  s = jnp.where(mask, s.reshape(b, h, t, -1), NEG_INF)
  return jnp.where(mask, jax.nn.softmax(s, axis=-1), 0.0)


DTYPES = [("float32", 1e-5), ("bfloat16", 2e-2)]  # Compute dtype, tolerance (of scale).


@pytest.mark.parametrize("kind, mixed", [("causal", "none"), ("prefix", "none"),
                                         ("bidirectional", "per_head")])
def test_mask_bias_equals_masking_scores_and_probabilities(kind, mixed):
  r = jax.random.split(jax.random.key(1), 3)
  q = jax.random.normal(r[0], (2, 12, 4, 8))
  k = jax.random.normal(r[1], (2, 12, 2, 8))
  seg = jnp.array([[1] * 5 + [2] * 5 + [0] * 2, [1] * 12])
  prefix = jnp.array([[1] * 2 + [0] * 3 + [1] * 3 + [0] * 4, [1] * 6 + [0] * 6])
  mask = masks.self_attention_mask(seg, kind=kind, prefix_bt=prefix if kind == "prefix" else None,
                                   mixed=mixed, num_heads=4)
  cot = jax.random.normal(r[2], (2, 4, 12, 12))
  new, new_vjp = jax.vjp(lambda a, b: attention_weights(a, b, mask), q, k)
  old, old_vjp = jax.vjp(lambda a, b: _where_weights(a, b, mask), q, k)
  assert_close_to_scale(new, old)
  assert float(jnp.abs(new[0, :, -2:]).max()) == 0.0  # Padding rows still attend to nothing.
  np.testing.assert_array_equal(np.asarray(new) > 0, np.asarray(mask & jnp.ones_like(new, bool)))
  for got, want in zip(new_vjp(cot), old_vjp(cot)):
    assert_close_to_scale(got, want)


def test_cpu_logits_matmul_equals_the_plain_dot():
  """float32 ``a b^T`` (the tied logits) with its hand-written gradient: forward and both
  gradients equal autodiff of the einsum."""
  r = jax.random.split(jax.random.key(2), 3)
  a = jax.random.normal(r[0], (6, 16))
  b = jax.random.normal(r[1], (40, 16))
  cot = jax.random.normal(r[2], (6, 40))
  out, vjp = jax.vjp(lambda x, w: XlaCpu().matmul(x, w, 1, jnp.float32), a, b)
  ref, ref_vjp = jax.vjp(lambda x, w: jnp.einsum("mk,nk->mn", x, w), a, b)
  assert_close_to_scale(out, ref, 1e-5)
  for got, want in zip(vjp(cot), ref_vjp(cot)):
    assert got.shape == want.shape
    assert_close_to_scale(got, want, 1e-5)


def test_cpu_logits_matmul_keeps_float64():
  with jax.enable_x64(True):
    a = jnp.ones((3, 4), jnp.float64) / 3
    b = jnp.ones((5, 4), jnp.float64)
    out, vjp = jax.vjp(lambda x, w: XlaCpu().matmul(x, w, 1, jnp.float64), a, b)
    assert out.dtype == jnp.float64 and abs(float(out[0, 0]) - 4 / 3) < 1e-14  # f32: ~1e-7.
    assert all(g.dtype == jnp.float64 for g in vjp(jnp.ones_like(out)))


@pytest.mark.parametrize("use_table", [False, True])
def test_rope_equals_the_complex_rotation(use_table):
  """Feature pairs (i, i + d/2) as complex numbers turned by ``position * wavelength^(-2i/d)``,
  in float64 numpy; from integer positions or from their ``rotary_table``."""
  x = np.random.RandomState(0).randn(2, 7, 3, 8).astype(np.float32)
  pos = np.random.RandomState(1).randint(0, 300, size=(2, 7)).astype(np.int32)
  rot = XlaCpu().rotary_table(jnp.asarray(pos), 8, 1e4) if use_table else jnp.asarray(pos)
  got = jax.jit(lambda a, r: apply_rope(a, r, 1e4))(jnp.asarray(x), rot)
  freq = 1e4 ** (-np.arange(4) * 2.0 / 8)  # [half]
  z = (x[..., :4] + 1j * x[..., 4:]) * np.exp(1j * pos[:, :, None, None] * freq)
  assert_close_to_scale(got, np.concatenate([z.real, z.imag], -1), 1e-5)


def _packed_batch(family: str) -> dict:
  """Two packed rows (segments restart positions; padding at the end), as the pipeline gives."""
  seg = jnp.array([[1] * 5 + [2] * 4 + [0] * 3, [1] * 7 + [2] * 5])
  pos = jnp.array([list(range(5)) + list(range(4)) + [0] * 3, list(range(7)) + list(range(5))])
  batch = {"decoder_input_tokens": tokens((2, 12)) * (seg > 0),
           "decoder_target_tokens": tokens((2, 12), 2) * (seg > 0),
           "decoder_segment_ids": seg, "decoder_positions": pos,
           "decoder_causal_attention": ((pos < 2) & (seg > 0)).astype(jnp.int32)}
  if family == "redllm":  # Decoder positions continue after each segment's encoder length.
    eseg = jnp.array([[1] * 3 + [2] * 6 + [0], [1] * 4 + [2] * 6])
    epos = jnp.array([list(range(3)) + list(range(6)) + [0], list(range(4)) + list(range(6))])
    batch.update(encoder_input_tokens=tokens((2, 10), 1) * (eseg > 0), encoder_segment_ids=eseg,
                 encoder_positions=epos,
                 decoder_positions=pos + jnp.where(seg == 1, jnp.array([[3], [4]]), 6) * (seg > 0))
  return batch


def _loss_and_grads(family: str, attention: str, batch: dict, backend: str = "auto"):
  """Loss (with z-loss) and parameter gradients of a tiny model on ``batch``, traced anew."""
  model = tiny_model(family, decoder_attention=attention, ops=backend)
  graphdef, params = nnx.split(model, nnx.Param)

  def loss(p):
    logits = nnx.merge(graphdef, p)(batch)
    return cross_entropy_with_z_loss(logits, batch["decoder_target_tokens"],
                                     (batch["decoder_segment_ids"] > 0).astype(jnp.float32),
                                     1e-4).loss
  return jax.jit(jax.value_and_grad(loss))(params)  # A new function: traced on every call.


@pytest.mark.parametrize("family, attention", [("decllm", "causal"), ("decllm", "prefix"),
                                               ("redllm", "causal")])
def test_rope_table_once_per_forward_equals_rotating_in_every_layer(family, attention,
                                                                    monkeypatch):
  """The models hand every layer the sin/cos table of their positions (``rotary_table``, made once
  per forward); the previous form rotated from the integer positions in every layer. Loss and
  gradients of packed batches agree (DecLLM causal and prefix, RedLLM with continuous positions
  and cross-attention RoPE)."""
  batch = _packed_batch(family)
  table = _loss_and_grads(family, attention, batch)
  for module in (decllm, redllm):  # Integer positions reach every layer's ``apply_rope``.
    monkeypatch.setattr(module, "rotary_table", lambda ops, positions, *args: positions)
  per_layer = _loss_and_grads(family, attention, batch)
  assert_close_to_scale(table[0], per_layer[0])
  assert_trees_close_to_scale(table[1], per_layer[1])


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_unrolled_layers_compute_the_rope_table_once(family):
  """XLA:CPU drops optimization barriers before it fuses: ``rotary_table`` keeps the sin/cos a
  buffer there (a conditional), else every layer's rotation recomputed them, forward and
  backward. The compiled loss-and-gradient of an unrolled model has as many cosines with 3 layers
  as with 1 (on any platform); on CPU each table's (DecLLM: its positions; RedLLM: encoder and
  decoder positions) in each of the conditional's two identical branches."""
  batch = _packed_batch(family)

  def cosines(layers):
    sizes = (dict(num_layers=layers) if family == "decllm" else
             dict(num_encoder_layers=layers, num_decoder_layers=layers))
    graphdef, params = nnx.split(tiny_model(family, scan_layers=False, **sizes), nnx.Param)

    def loss(p, b):  # The batch an argument, as in training (constant positions fold the table).
      logits = nnx.merge(graphdef, p)(b)
      return cross_entropy_with_z_loss(logits, b["decoder_target_tokens"], None, 1e-4).loss
    return jax.jit(jax.grad(loss)).lower(params, batch).compile().as_text().count(" cosine(")

  one, three = cosines(1), cosines(3)
  assert one == three, (one, three)
  if jax.default_backend() == "cpu":  # model.ops "auto": an XLA:CPU backend.
    assert three == 2 * (1 if family == "decllm" else 2), three


def _dot_key_lengths(fn, *args) -> list[int]:
  """The key lengths (last output axis) of every score product ``fn``'s jaxpr computes."""
  jaxpr = jax.make_jaxpr(fn)(*args)
  out = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general" and eqn.outvars[0].aval.ndim == 4:
      out.append(eqn.outvars[0].aval.shape[-1])
  return out


@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize("dtype, rel", DTYPES)
def test_causal_blocks_equal_the_whole_softmax(kv_heads, dtype, rel, monkeypatch):
  """Causal query blocks, each attending only the keys up to its own last row, give the softmax
  over every key (those keys are masked for the whole block): packed causal rows with padding,
  grouped kv heads, forward and gradients; and the blocks really skip keys."""
  monkeypatch.setattr(xla_cpu, "CAUSAL_BLOCK", 4)  # 12 queries: blocks of 4, 4 and 4.
  r = jax.random.split(jax.random.key(5), 4)
  q = jax.random.normal(r[0], (2, 12, 4, 8))
  k = jax.random.normal(r[1], (2, 12, kv_heads, 8))
  v = jax.random.normal(r[2], (2, 12, kv_heads, 8))
  seg = jnp.array([[1] * 5 + [2] * 4 + [0] * 3, [1] * 12])
  mask = masks.self_attention_mask(seg, kind="causal")
  cot = jax.random.normal(r[3], (2, 12, 4, 8))

  def core(causal):
    return lambda a, b, c: XlaCpu().attention(a, b, c, mask, causal=causal)

  ref, ref_vjp = jax.vjp(core(False), q, k, v)  # float32 reference, every key.
  dt = jnp.dtype(dtype)
  got, vjp = jax.vjp(core(True), q.astype(dt), k.astype(dt), v.astype(dt))
  assert got.dtype == dt
  assert_close_to_scale(got, ref, rel)
  assert float(jnp.abs(got[0, -3:]).max()) == 0.0  # Padding queries still attend to nothing.
  for g, want in zip(vjp(cot.astype(dt)), ref_vjp(cot)):
    assert_close_to_scale(g, want, rel)
  assert _dot_key_lengths(core(True), q, k, v)[::2] == [4, 8, 12]  # Scores, then PV per block.
  assert _dot_key_lengths(core(False), q, k, v)[::2] == [12]
  monkeypatch.setattr(xla_cpu, "CAUSAL_MAX_BLOCKS", 2)  # Longer blocks, not more of them.
  assert _dot_key_lengths(core(True), q, k, v)[::2] == [6, 12]


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_causal_blocks_in_the_model_equal_one_block(family, monkeypatch):
  """Loss and gradients of a packed batch with the causal stacks in blocks of 4 queries equal
  one block (DecLLM causal self-attention; RedLLM's decoder, continuous positions) on the
  ``xla_cpu`` backend; prefix masks are not causal and are never split."""
  batch = _packed_batch(family)
  whole = _loss_and_grads(family, "causal", batch, "xla_cpu")
  monkeypatch.setattr(xla_cpu, "CAUSAL_BLOCK", 4)
  key_lengths = []  # Of every self-attention core the model traces (cross-attention: 10 keys).
  attend = xla_cpu._attend
  monkeypatch.setattr(xla_cpu, "_attend",
                      lambda q, k, *a: key_lengths.append(k.shape[1]) or attend(q, k, *a))
  blocks = _loss_and_grads(family, "causal", batch, "xla_cpu")
  assert {4, 8, 12} <= set(key_lengths), key_lengths  # The causal stack did run in blocks.
  assert_close_to_scale(blocks[0], whole[0])
  assert_trees_close_to_scale(blocks[1], whole[1])
  if family == "decllm":  # A prefix mask lets the prefix see later keys: never in blocks.
    key_lengths.clear()
    _loss_and_grads(family, "prefix", batch, "xla_cpu")
    assert set(key_lengths) == {12}, key_lengths


def _autodiff_rms_norm(x, scale, n, eps):
  """The formula the hand-written VJP replaced, differentiated by JAX."""
  red = tuple(range(x.ndim - n, x.ndim))
  return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=red, keepdims=True) + eps) * scale


@pytest.mark.parametrize("shape,n", [((3, 5, 16), 1), ((3, 5, 4, 8), 1), ((3, 5, 4, 8), 2)])
def test_rms_norm_vjp_equals_autodiff_in_float64(shape, n):
  """Forward and both gradients equal autodiff's to float64 rounding, for a norm over the last
  axis (d, or head_dim per head) and over the last two (all heads together)."""
  rng = np.random.default_rng(0)
  with jax.enable_x64(True):
    x = jnp.asarray(rng.normal(size=shape) * 3.0)
    scale = jnp.asarray(rng.normal(size=shape[-n:]))
    dy = jnp.asarray(rng.normal(size=shape))
    eps = 1e-6
    out, vjp = jax.vjp(lambda a, s: xla._rms_norm(a, s, n, eps), x, scale)
    want, want_vjp = jax.vjp(lambda a, s: _autodiff_rms_norm(a, s, n, eps), x, scale)
    assert out.dtype == jnp.float64
    np.testing.assert_allclose(out, want, rtol=1e-13, atol=1e-13)
    for got, ref in zip(vjp(dy), want_vjp(dy)):
      assert got.shape == ref.shape and got.dtype == jnp.float64
      np.testing.assert_allclose(got, ref, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("dtype,rel", DTYPES)
def test_rms_norm_module_gradients_equal_autodiff(dtype, rel):
  """The module (float32 inside, the input's dtype out), differentiated through its parameter
  and its input, against autodiff of the formula it used to compute: forward and the gradients
  of x and of the scale to reordering tolerance."""
  norm = norms.RMSNorm((8,), ("kv",), eps=1e-6, param_dtype="float32", ops=XLA,
                       rngs=nnx.Rngs(0))
  norm.scale[...] = jnp.linspace(0.5, 1.5, 8)
  graphdef, params = nnx.split(norm)
  x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 6, 4, 8)), dtype)
  cot = jnp.asarray(np.random.default_rng(2).normal(size=(2, 6, 4, 8)), jnp.float32)

  def module_loss(params, x):
    return jnp.sum(nnx.merge(graphdef, params)(x).astype(jnp.float32) * cot)

  def formula(scale, x):
    return _autodiff_rms_norm(x.astype(jnp.float32), scale, 1, 1e-6).astype(dtype)

  def formula_loss(scale, x):
    return jnp.sum(formula(scale, x).astype(jnp.float32) * cot)
  scale = norm.scale[...]
  y = nnx.merge(graphdef, params)(x)
  assert y.dtype == x.dtype
  assert_close_to_scale(np.asarray(y, np.float32), np.asarray(formula(scale, x), np.float32), rel)
  g_params, g_x = jax.grad(module_loss, argnums=(0, 1))(params, x)
  want_scale, want_x = jax.grad(formula_loss, argnums=(0, 1))(scale, x)
  (g_scale,) = jax.tree.leaves(g_params)
  assert g_x.dtype == want_x.dtype == x.dtype
  assert_close_to_scale(np.asarray(g_x, np.float32), np.asarray(want_x, np.float32), rel)
  assert_close_to_scale(np.asarray(g_scale, np.float32), np.asarray(want_scale, np.float32), rel)
