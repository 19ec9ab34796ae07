"""The ``xla`` backend: the reference operations in forms chosen on XLA:CPU measurements (the
TPU/GPU default; how it compares with ``reference`` on a TPU: docs/compile.md).

- Products as one 2-D ``[N, K] x [K, M]`` matmul (the major axes merged; sharded batch/heads axes
  stay sharded): with [batch, length, ...] operands the weight gradient contracts over two axes,
  which XLA:CPU ran ~1.7x slower for the SwiGLU MLP (``benchmarks/step_breakdown.py``).
- RMSNorm with a hand-written VJP: autodiff of the formula broadcasts ``scale`` and ``rsqrt``
  to full size for its backward reductions; this backward has one reduction for ``x`` and one
  for ``scale`` (~6 % less in temporary buffers in the small train steps).
- The RoPE table kept a buffer (an optimization barrier): fused into every consumer instead,
  sin/cos were recomputed per head and per layer, forward and backward.
- The attention core on heads-major operands, a kv group's query heads stacked along the query
  axis (XLA:CPU 1.3-1.5x faster than with a separate group axis), the mask as an additive bias,
  one score matrix per attention whatever the mask (causal query blocks are ``xla_cpu``'s: on a
  TPU every block is its own kernels, ~35k more VLIW bundles each for an 8B step's compile,
  while ``attention_impl=splash`` skips masked blocks with the compile of one).
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from t5like.ops.reference import NEG_INF, Reference, Rotary, dropout, rotation


def _low(dt) -> bool:
  return jnp.dtype(dt) in (jnp.bfloat16, jnp.float16)


@dataclasses.dataclass(frozen=True)
class Xla(Reference):
  name = "xla"

  def dense(self, x, w, n_contract=1):
    lead, contract = x.shape[:x.ndim - n_contract], x.shape[x.ndim - n_contract:]
    assert tuple(w.shape[:n_contract]) == tuple(contract), (x.shape, w.shape)
    k = math.prod(contract)
    y = self.matmul(x.reshape(-1, k), w.astype(x.dtype).reshape(k, -1), 0, x.dtype)
    return y.reshape(*lead, *w.shape[n_contract:])

  def logits(self, x_btd, table_vd):
    x_md = x_btd.reshape(-1, x_btd.shape[-1])
    y = self.matmul(x_md, table_vd.astype(x_btd.dtype), 1, jnp.float32)
    return y.reshape(*x_btd.shape[:-1], -1)

  def matmul(self, a_mk, b, b_contract: int, out_dtype) -> jax.Array:
    """``a [M, K]`` times ``b [K, N]`` (``b_contract=0``) or ``b [N, K]`` (``1``); a float32
    output only where asked for (``reference.dense`` says why)."""
    acc = jnp.float32 if _low(a_mk.dtype) and jnp.dtype(out_dtype) == jnp.float32 else None
    y = jax.lax.dot_general(a_mk, b, (((1,), (b_contract,)), ((), ())),
                            preferred_element_type=acc)
    return y.astype(out_dtype)

  def rms_norm(self, x, scale, eps):
    y = _rms_norm(x.astype(jnp.float32), scale.astype(jnp.float32), scale.ndim, eps)
    return y.astype(x.dtype)

  def rotary_table(self, positions_bt, head_dim, max_wavelength):
    # The barrier keeps the table a buffer: without it XLA fuses sin/cos back into every consumer.
    return Rotary(*jax.lax.optimization_barrier(
        tuple(rotation(positions_bt, head_dim, max_wavelength))))

  def attention_core(self, q_bthk, k_bsgk, v_bsgk, mask_bhts, causal, dropout_rate, rng):
    return _attend(q_bthk, k_bsgk, v_bsgk, mask_bhts, dropout_rate, rng)


def _heads_major(x_bsgk: jax.Array) -> jax.Array:
  """[batch, s, heads, kv] <-> [batch, heads, s, kv]."""
  return jnp.swapaxes(x_bsgk, 1, 2)


def attention_weights(q_bthk, k_bsgk, mask_bhts) -> jax.Array:
  """``reference.attention_weights`` on heads-major operands, the mask as an additive bias (a
  masked score becomes NEG_INF + score, whose exp is exactly 0 beside any unmasked one)."""
  dt = q_bthk.dtype
  b, t, h, k = q_bthk.shape
  g = k_bsgk.shape[2]
  q_bgqk = _heads_major(q_bthk * jnp.asarray(k ** -0.5, dt)).reshape(b, g, h // g * t, k)
  scores_bgqs = jnp.einsum("bgqk,bgsk->bgqs", q_bgqk, _heads_major(k_bsgk),
                           preferred_element_type=jnp.float32)
  scores_bhts = scores_bgqs.reshape(b, h, t, -1) + jnp.where(mask_bhts, 0.0, NEG_INF)
  live_bht1 = jnp.any(mask_bhts, axis=-1, keepdims=True)
  return jax.nn.softmax(scores_bhts, axis=-1) * live_bht1


def _attend(q_bthk, k_bsgk, v_bsgk, mask_bhts, dropout_rate, rng) -> jax.Array:
  dt = q_bthk.dtype
  b, t, h, k = q_bthk.shape
  g = k_bsgk.shape[2]
  probs_bhts = dropout(attention_weights(q_bthk, k_bsgk, mask_bhts).astype(dt), dropout_rate,
                       rng)
  probs_bgqs = probs_bhts.reshape(b, g, h // g * t, -1)
  out_bgqk = jnp.einsum("bgqs,bgsk->bgqk", probs_bgqs, _heads_major(v_bsgk))
  return _heads_major(out_bgqk.reshape(b, h, t, k))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _rms_norm(x, scale, n: int, eps: float):
  """``x * rsqrt(mean(x^2) + eps) * scale`` over the trailing ``n`` axes (float32 in, out)."""
  return _normalise(x, n, eps)[0] * scale


def _normalise(x, n, eps):
  r = jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=tuple(range(x.ndim - n, x.ndim)),
                             keepdims=True) + eps)
  return x * r, r


def _rms_norm_fwd(x, scale, n, eps):
  xr, r = _normalise(x, n, eps)
  return xr * scale, (x, scale, r)


def _rms_norm_bwd(n, eps, residuals, dy):
  # y = x r s, r = (mean(x^2) + eps)^-1/2  =>  dx = r (g - x r^2 mean(g x)) with g = dy s,
  # ds = sum over the leading axes of dy x r.
  x, scale, r = residuals
  xr = x * r
  g = dy * scale
  dx = r * (g - xr * jnp.mean(g * xr, axis=tuple(range(x.ndim - n, x.ndim)), keepdims=True))
  return dx, jnp.sum(dy * xr, axis=tuple(range(x.ndim - n)))


_rms_norm.defvjp(_rms_norm_fwd, _rms_norm_bwd)
