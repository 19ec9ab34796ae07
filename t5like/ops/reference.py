"""The reference forms of the operations the model calls: plain ``jnp`` / ``jax.nn``, each the
formula of the paper (docs/paper.md §1), computing the model on every platform. The fused
attention cores (``fused_attention.py``) are the only other implementations; the tests hold them
to ``dot_product_attention``.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from t5like.ops import hash_bits

NEG_INF = -0.7 * float(jnp.finfo(jnp.float32).max)  # Finite, so fully-masked rows stay NaN-free.


class Rotary(NamedTuple):
  """RoPE rotation of every position: float32 [batch, length, 1, head_dim / 2] each."""
  sin: jax.Array
  cos: jax.Array


def rotation(positions_bt: jax.Array, head_dim: int, max_wavelength: float) -> Rotary:
  """sin / cos of ``position * max_wavelength^(-2i / head_dim)`` for feature pairs i < d/2."""
  half = head_dim // 2
  inv_freq = max_wavelength ** (-jnp.arange(half, dtype=jnp.float32) * 2.0 / head_dim)
  angle_bth = positions_bt.astype(jnp.float32)[:, :, None] * inv_freq
  return Rotary(jnp.sin(angle_bth)[:, :, None, :], jnp.cos(angle_bth)[:, :, None, :])


def rope(x_bthd: jax.Array, rot: Rotary) -> jax.Array:
  """Rotates feature pairs (i, i + d/2) of ``x [batch, length, heads, head_dim]`` (in float32)."""
  half = x_bthd.shape[-1] // 2
  x = x_bthd.astype(jnp.float32)
  x1, x2 = x[..., :half], x[..., half:]
  out = jnp.concatenate([x1 * rot.cos - x2 * rot.sin, x2 * rot.cos + x1 * rot.sin], axis=-1)
  return out.astype(x_bthd.dtype)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  """``x / sqrt(mean(x^2) + eps) * scale`` over ``scale``'s trailing axes, in float32."""
  axes = tuple(range(x.ndim - scale.ndim, x.ndim))
  xf = x.astype(jnp.float32)
  r = jax.lax.rsqrt(jnp.mean(jnp.square(xf), axis=axes, keepdims=True) + eps)
  return (xf * r * scale.astype(jnp.float32)).astype(x.dtype)


def dropout(x: jax.Array, rate: float, rng: jax.Array | None) -> jax.Array:
  """Inverted dropout; identity when ``rng`` is None (deterministic) or ``rate`` is 0.

  An element is kept with probability q = round(2^32 (1 - rate)) / 2^32 and scaled by 1/q, so
  the output's expectation is ``x``. The keep draw compares 32 bits per element from
  ``hash_bits.uniform_bits`` (a keyed hash of the element's index) with q, instead of
  ``jax.random.bernoulli``'s threefry: the same mask on every backend and sharding, at a
  fraction of the compiled kernel (``hash_bits`` says why).
  """
  if rng is None or rate == 0.0:
    return x
  q = min(max(round(2.0 ** 32 * (1.0 - rate)), 1), 2 ** 32 - 1)  # Keep probability / 2^-32.
  keep = hash_bits.uniform_bits(rng, x.shape) < jnp.uint32(q)
  return jnp.where(keep, x * jnp.asarray(2.0 ** 32 / q, x.dtype), jnp.zeros_like(x))


def fold(rng: jax.Array | None, *data: int | jax.Array) -> jax.Array | None:
  """Derives an independent key per (layer, site); passes None through."""
  if rng is None:
    return None
  for d in data:
    rng = jax.random.fold_in(rng, d)
  return rng


def attention_weights(q_bthk: jax.Array, k_bsgk: jax.Array, mask_bhts: jax.Array,
                      soft_cap: float = 0.0) -> jax.Array:
  """float32 ``softmax(q k^T / sqrt(d_h))`` [batch, heads, t, s] over the allowed keys (grouped
  kv heads: query head ``i`` reads kv head ``i // (heads / kv_heads)``); a query with no
  allowed key gets all zeros. ``soft_cap`` > 0: scores become ``cap * tanh(score / cap)``."""
  b, t, h, k = q_bthk.shape
  g = k_bsgk.shape[2]
  q_btgrk = (q_bthk * jnp.asarray(k ** -0.5, q_bthk.dtype)).reshape(b, t, g, h // g, k)
  scores_bgrts = jnp.einsum("btgrk,bsgk->bgrts", q_btgrk, k_bsgk,
                            preferred_element_type=jnp.float32)
  scores_bhts = scores_bgrts.reshape(b, h, t, -1)
  if soft_cap:
    scores_bhts = soft_cap * jnp.tanh(scores_bhts / soft_cap)
  scores_bhts = jnp.where(mask_bhts, scores_bhts, NEG_INF)
  live_bht1 = jnp.any(mask_bhts, axis=-1, keepdims=True)
  return jax.nn.softmax(scores_bhts, axis=-1) * live_bht1


def dot_product_attention(q_bthk: jax.Array, k_bsgk: jax.Array, v_bsgk: jax.Array,
                          mask_bhts: jax.Array, dropout_rate: float = 0.0,
                          rng: jax.Array | None = None, soft_cap: float = 0.0) -> jax.Array:
  """``softmax(q k^T / sqrt(d_h)) v`` under the bool mask [batch, heads|1, t, s]; returns
  [batch, t, heads, head_dim] in q's dtype (dropout on the probabilities)."""
  b, t, h, k = q_bthk.shape
  g = k_bsgk.shape[2]
  probs_bhts = attention_weights(q_bthk, k_bsgk, mask_bhts, soft_cap).astype(q_bthk.dtype)
  probs_bgrts = dropout(probs_bhts, dropout_rate, rng).reshape(b, g, h // g, t, -1)
  out_btgrk = jnp.einsum("bgrts,bsgk->btgrk", probs_bgrts, v_bsgk)
  return out_btgrk.reshape(b, t, h, k)


@dataclasses.dataclass(frozen=True)
class Reference:
  """The operations the model calls, in their reference forms, and the dispatch of a
  ``MaskSpec`` mask to the fused attention core (``docs/architecture.md`` "Ops")."""
  attention_impl: str = "reference"  # model.attention_impl: the core for a ``MaskSpec`` mask.
  max_segments_per_row: int = 1  # model.max_segments_per_row: cuDNN's packed-layout slots.
  soft_cap: float = 0.0  # model.attention_logit_soft_cap.

  @classmethod
  def of(cls, cfg) -> "Reference":
    """The operations of a ModelConfig whose ``attention_impl`` is resolved (``ops.resolve``)."""
    return cls(cfg.attention_impl, cfg.max_segments_per_row, cfg.attention_logit_soft_cap)

  @property
  def fused(self) -> bool:
    """Whether the attention core is a fused kernel, fed a ``MaskSpec`` instead of a mask."""
    return self.attention_impl in ("splash", "cudnn")

  def dense(self, x: jax.Array, w: jax.Array, n_contract: int = 1) -> jax.Array:
    """``x [..., *c] @ w [*c, *o] -> [..., *o]`` in x's dtype. No float32 output is asked for:
    TPU and GPU products accumulate in float32 inside and round once to x's dtype, and a float32
    output would make the backward products float32 too (a bf16 step's weight and input
    gradients ran as TF32 products on an H200, half its time)."""
    return jnp.tensordot(x, w.astype(x.dtype), n_contract)

  def logits(self, x_btd: jax.Array, table_vd: jax.Array) -> jax.Array:
    """float32 ``x @ table^T``: [..., embed] against the tied [vocab, embed] table."""
    return jnp.einsum("...d,vd->...v", x_btd, table_vd.astype(x_btd.dtype),
                      preferred_element_type=jnp.float32)

  def rms_norm(self, x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    return rms_norm(x, scale, eps)

  def norm_rope(self, x_bthd: jax.Array, scale_d: jax.Array | None, rot: Rotary | None,
                eps: float) -> jax.Array:
    """Attention's per-head Q/K/V norm (``scale`` None: none), then RoPE (``rot`` None: none)."""
    if scale_d is not None:
      x_bthd = self.rms_norm(x_bthd, scale_d, eps)
    return x_bthd if rot is None else rope(x_bthd, rot)

  def rotary_table(self, positions_bt: jax.Array, head_dim: int,
                   max_wavelength: float) -> Rotary:
    """The rotation of ``positions_bt``, computed once per forward for every layer to read."""
    return rotation(positions_bt, head_dim, max_wavelength)

  def attention(self, q_bthk: jax.Array, k_bsgk: jax.Array, v_bsgk: jax.Array, mask, *,
                causal: bool = False, dropout_rate: float = 0.0,
                rng: jax.Array | None = None) -> jax.Array:
    """The attention core, [batch, t, heads, head_dim]. ``mask``: bool [batch, heads|1, t, s],
    or a ``models.masks.MaskSpec`` for ``model.attention_impl``'s fused kernel. ``causal``:
    the mask allows no key after its query (a backend may skip those keys)."""
    if isinstance(mask, tuple):  # A MaskSpec (a NamedTuple): the fused core never builds it.
      from t5like.ops import fused_attention
      return fused_attention.attend(self.attention_impl, q_bthk, k_bsgk, v_bsgk, mask,
                                    max_segments_per_row=self.max_segments_per_row,
                                    soft_cap=self.soft_cap)
    del causal
    return dot_product_attention(q_bthk, k_bsgk, v_bsgk, mask, dropout_rate, rng, self.soft_cap)

  def attention_weights(self, q_bthk: jax.Array, k_bsgk: jax.Array,
                        mask_bhts: jax.Array) -> jax.Array:
    """The probabilities the attention core computes (what attention analysis reads)."""
    return attention_weights(q_bthk, k_bsgk, mask_bhts, self.soft_cap)

  def argmax(self, logits_bv: jax.Array) -> jax.Array:
    """int32 [batch]: the first maximum of each row."""
    return jnp.argmax(logits_bv, axis=-1).astype(jnp.int32)
