"""Fixed-shape key/value cache of one attention stack, updated in place under ``jit``.

Keys are stored already normed and RoPE-rotated (``Attention.project_qkv`` output), so a cached
key never needs its position again. Every row writes the same slot at each step (DecLLM prompts
are left-padded so they all end at the same slot); ``valid_bs`` marks the slots a query may see
(not padding, already written), which with one write per step is also the causal mask.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from t5like.config.model import ModelConfig
from t5like.models.layers import constrain, dtype

CACHE_AXES = ("layers", "batch", "length", "heads", "kv")


class KVCache(NamedTuple):
  k_lbsgk: jax.Array  # [layers, batch, slots, kv_heads, head_dim] rotated keys.
  v_lbsgk: jax.Array  # [layers, batch, slots, kv_heads, head_dim] values.
  valid_bs: jax.Array  # bool [batch, slots]: slot written and not padding.


def init_cache(cfg: ModelConfig, num_layers: int, batch: int, slots: int) -> KVCache:
  shape = (num_layers, batch, slots, cfg.kv_heads, cfg.head_dim)
  zeros = lambda: constrain(jnp.zeros(shape, dtype(cfg.dtype)), CACHE_AXES)  # noqa: E731
  return KVCache(zeros(), zeros(), jnp.zeros((batch, slots), bool))


def write_layer(kv_lbsgk: jax.Array, layer: jax.Array | int, slot: jax.Array | int,
                new_bsgk: jax.Array) -> jax.Array:
  """Writes ``new_bsgk`` [batch, t, kv_heads, head_dim] at ``slot`` of layer ``layer``."""
  zero = jnp.zeros((), jnp.int32)
  idx = (jnp.asarray(layer, jnp.int32), zero, jnp.asarray(slot, jnp.int32), zero, zero)
  out = jax.lax.dynamic_update_slice(kv_lbsgk, new_bsgk[None].astype(kv_lbsgk.dtype), idx)
  return constrain(out, CACHE_AXES)


def read_layer(kv_lbsgk: jax.Array, layer: jax.Array | int) -> jax.Array:
  """[batch, slots, kv_heads, head_dim] of one layer."""
  return jax.lax.dynamic_index_in_dim(kv_lbsgk, jnp.asarray(layer, jnp.int32), keepdims=False)


def mark_valid(valid_bs: jax.Array, slot: jax.Array | int, new_bt: jax.Array) -> jax.Array:
  """Sets ``valid`` [batch, t] at ``slot`` (the tokens just written)."""
  return jax.lax.dynamic_update_slice(valid_bs, new_bt.astype(bool),
                                      (jnp.zeros((), jnp.int32), jnp.asarray(slot, jnp.int32)))
