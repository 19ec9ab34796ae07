"""Fixed-shape key/value cache, one buffer per layer, updated in place under ``jit``.

Keys are stored already normed and RoPE-rotated (``Attention.project_qkv`` output), so a cached
key never needs its position again. Layout ``[batch, kv_heads, slots, head_dim]`` per layer:
the decode step's attention is then a batched product over (batch, kv_heads) with no transpose
of the cache, and each layer's buffer is its own while-loop carry (updated in place; a stacked
``[layers, ...]`` cache is sliced and copied by every layer of every step on XLA:CPU). Every row
writes the same slot at each step (DecLLM prompts are left-padded so they all end at the same
slot); ``valid_bs`` marks the slots a query may see (not padding, already written), which with
one write per step is also the causal mask.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from t5like.kernels import cache_attention
from t5like.models.attention import NEG_INF
from t5like.models.layers import constrain

CACHE_AXES = ("batch", "heads", "length", "kv")


class KVCache(NamedTuple):
  k: tuple[jax.Array, ...]  # Per layer [batch, kv_heads, slots, head_dim] rotated keys.
  v: tuple[jax.Array, ...]  # Per layer [batch, kv_heads, slots, head_dim] values.
  valid_bs: jax.Array  # bool [batch, slots]: slot written and not padding.


def to_cache_layout(kv_lbsgk: jax.Array, slots: int) -> tuple[jax.Array, ...]:
  """Stacked [layers, batch, s, kv_heads, head_dim] (a layer scan's output) -> per-layer
  [batch, kv_heads, slots, head_dim] buffers, zero beyond ``s``."""
  pad = ((0, 0), (0, 0), (0, slots - kv_lbsgk.shape[2]), (0, 0))
  return tuple(constrain(jnp.pad(jnp.swapaxes(kv_lbsgk[i], 1, 2), pad), CACHE_AXES)
               for i in range(kv_lbsgk.shape[0]))


def empty(num_layers: int, batch: int, kv_heads: int, slots: int, head_dim: int,
          dt) -> KVCache:
  zeros = lambda: constrain(jnp.zeros((batch, kv_heads, slots, head_dim), dt),  # noqa: E731
                            CACHE_AXES)
  return KVCache(tuple(zeros() for _ in range(num_layers)),
                 tuple(zeros() for _ in range(num_layers)), jnp.zeros((batch, slots), bool))


def write(kv_bgsk: jax.Array, slot: jax.Array | int, new_b1gk: jax.Array) -> jax.Array:
  """Stores the new token's [batch, 1, kv_heads, head_dim] at ``slot``."""
  zero = jnp.zeros((), jnp.int32)
  new_bg1k = jnp.swapaxes(new_b1gk, 1, 2).astype(kv_bgsk.dtype)
  out = jax.lax.dynamic_update_slice(kv_bgsk, new_bg1k,
                                     (zero, zero, jnp.asarray(slot, jnp.int32), zero))
  return constrain(out, CACHE_AXES)


def mark_valid(valid_bs: jax.Array, slot: jax.Array | int, new_bt: jax.Array) -> jax.Array:
  """Sets ``valid`` [batch, t] at ``slot`` (the tokens just written)."""
  return jax.lax.dynamic_update_slice(valid_bs, new_bt.astype(bool),
                                      (jnp.zeros((), jnp.int32), jnp.asarray(slot, jnp.int32)))


def attend(q_b1hk: jax.Array, k_bgsk: jax.Array, v_bgsk: jax.Array,
           valid_bs: jax.Array) -> jax.Array:
  """One query token per row over cached keys: [batch, 1, heads, head_dim].

  The same arithmetic as ``models.attention.dot_product_attention`` (query scaled in the
  compute dtype, float32 scores and softmax, masked probabilities zeroed), on the cache layout;
  in float32 on CPU one kernel call (``t5like.kernels.cache_attention``) where it is built.
  """
  dt = q_b1hk.dtype
  b, _, h, k = q_b1hk.shape
  g = k_bgsk.shape[1]
  q_bgrk = q_b1hk.reshape(b, g, h // g, k) * jnp.asarray(k ** -0.5, dt)
  if cache_attention.applies(q_bgrk, k_bgsk, v_bgsk):  # float32 on one CPU device.
    return cache_attention.attend(q_bgrk, k_bgsk, v_bgsk, valid_bs).reshape(b, 1, h, k)
  scores_bgrs = jnp.einsum("bgrk,bgsk->bgrs", q_bgrk, k_bgsk,
                           preferred_element_type=jnp.float32)
  mask_b11s = valid_bs[:, None, None, :]
  probs_bgrs = jax.nn.softmax(jnp.where(mask_b11s, scores_bgrs, NEG_INF), axis=-1)
  probs_bgrs = jnp.where(mask_b11s, probs_bgrs, 0.0).astype(dt)
  out_bgrk = jnp.einsum("bgrs,bgsk->bgrk", probs_bgrs, v_bgsk)
  return out_bgrk.reshape(b, 1, h, k)
