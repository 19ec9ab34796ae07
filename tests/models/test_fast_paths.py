"""The rewritten hot paths equal the forms they replaced (benchmarks/step_breakdown.py says why
they were rewritten): 2-D projections vs the einsums, the additive mask bias vs masking scores and
probabilities, the float32 logits matmul vs the plain dot — forward and gradients, float32 to
reordering tolerance, bfloat16 within 2e-2 of the float32 result's scale."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import tiny_model
from numerics import assert_close_to_scale
from t5like.models import masks
from t5like.models.attention import NEG_INF, attention_weights
from t5like.models.layers import matmul_2d, project, transpose_kernel


def _where_weights(q, k, mask):
  """The previous form: masked scores, softmax, masked probabilities."""
  b, t, h, d = q.shape
  g = k.shape[2]
  qr = q.reshape(b, t, g, h // g, d) * jnp.asarray(d ** -0.5, q.dtype)
  s = jnp.einsum("btgrk,bsgk->bgrts", qr, k, preferred_element_type=jnp.float32)
  s = jnp.where(mask, s.reshape(b, h, t, -1), NEG_INF)
  return jnp.where(mask, jax.nn.softmax(s, axis=-1), 0.0)


# einsum -> (contracted axes of the weight, x shape, w shape); x is [batch, length, ...].
PROJECTIONS = {"btd,dhk->bthk": (1, (3, 5, 16), (16, 4, 8)),
               "bthk,hkd->btd": (2, (3, 5, 4, 8), (4, 8, 16)),
               "btd,df->btf": (1, (3, 5, 16), (16, 24))}
DTYPES = [("float32", 1e-5), ("bfloat16", 2e-2)]  # Compute dtype, tolerance (of scale).


@pytest.mark.parametrize("spec", list(PROJECTIONS))
@pytest.mark.parametrize("dtype, rel", DTYPES)
def test_project_equals_the_einsum(spec, dtype, rel):
  n, x_shape, w_shape = PROJECTIONS[spec]
  r = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(r[0], x_shape)
  w = jax.random.normal(r[1], w_shape)
  cot = jax.random.normal(r[2], jnp.einsum(spec, x, w).shape)
  ref_out, ref_vjp = jax.vjp(lambda a, b: jnp.einsum(spec, a, b), x, w)  # float32 reference
  dt = jnp.dtype(dtype)
  out, vjp = jax.vjp(lambda a, b: project(a, b, n), x.astype(dt), w.astype(dt))
  assert_close_to_scale(out, ref_out, rel)
  for got, want in zip(vjp(cot.astype(dt)), ref_vjp(cot)):
    assert_close_to_scale(got, want, rel)


@pytest.mark.parametrize("spec", list(PROJECTIONS))
@pytest.mark.parametrize("dtype, rel", DTYPES)
def test_project_with_a_transposed_kernel_equals_the_einsum(spec, dtype, rel):
  """The decode step's ``TransposedKernel`` ([out, in] storage) is the same contraction, here
  with one token per row as in a decode step."""
  n, x_shape, w_shape = PROJECTIONS[spec]
  x_shape = (8, 1) + x_shape[2:]
  r = jax.random.split(jax.random.key(3), 2)
  x = jax.random.normal(r[0], x_shape)
  w = jax.random.normal(r[1], w_shape)
  dt = jnp.dtype(dtype)
  kernel = transpose_kernel(w, n).astype(dt)
  assert kernel.w_nk.shape == (np.prod(w_shape[n:]), np.prod(w_shape[:n]))
  out = jax.jit(lambda a, b: project(a, b, n))(x.astype(dt), kernel)
  assert out.dtype == dt
  assert_close_to_scale(out, jnp.einsum(spec, x, w), rel)


@pytest.mark.parametrize("dtype, rel", DTYPES)
@pytest.mark.parametrize("rows", [1, 8])
def test_decode_logits_through_the_table_equal_the_training_logits(rows, dtype, rel):
  """``TiedEmbedding.logits`` with ``decode_table()`` (the decode step's product, the table as
  the streamed operand) equals the training path over the parameter."""
  emb = tiny_model("decllm", dtype=dtype).embedding
  x = jax.random.normal(jax.random.key(4), (rows, 1, emb.cfg.d_model)).astype(dtype)
  table = emb.decode_table()
  assert table.w_nk is emb.table.get_value()  # The parameter itself: no per-call copy.
  got = jax.jit(lambda a, t: emb.logits(a, t))(x, table)
  want = jax.jit(emb.logits)(x)
  assert got.dtype == want.dtype == jnp.float32 and got.shape == (rows, 1, emb.cfg.vocab_size)
  assert_close_to_scale(got, want, rel)


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
  out, vjp = jax.vjp(lambda x, w: matmul_2d(x, w, 1, jnp.float32), a, b)
  ref, ref_vjp = jax.vjp(lambda x, w: jnp.einsum("mk,nk->mn", x, w), a, b)
  assert_close_to_scale(out, ref, 1e-5)
  for got, want in zip(vjp(cot), ref_vjp(cot)):
    assert got.shape == want.shape
    assert_close_to_scale(got, want, 1e-5)


def test_cpu_logits_matmul_keeps_float64():
  with jax.enable_x64(True):
    a = jnp.ones((3, 4), jnp.float64) / 3
    b = jnp.ones((5, 4), jnp.float64)
    out, vjp = jax.vjp(lambda x, w: matmul_2d(x, w, 1, jnp.float64), a, b)
    assert out.dtype == jnp.float64 and abs(float(out[0, 0]) - 4 / 3) < 1e-14  # f32: ~1e-7.
    assert all(g.dtype == jnp.float64 for g in vjp(jnp.ones_like(out)))
