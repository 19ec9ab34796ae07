"""Attention of a few query rows per (batch, kv head) over their keys/values, float32 on CPU
(``cache_attention.cc``): the decode step's one token per row over its cache, and a prompt under
its mask.

The decode step's attention is two batched products with one query row per (batch, head) and a
masked softmax between them, which XLA:CPU runs on Eigen at ~11-15 GB/s; the kernel reads each
pair's keys and values once, at the valid slots only (docs/performance.md).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from t5like.kernels import library


def applies(q_bgrd: jax.Array, k_bgsd: jax.Array, v_bgsd: jax.Array) -> bool:
  """Whether ``attend`` serves these operands: float32, head_dim a multiple of 8, and the
  kernels usable (``library.usable``)."""
  return (all(x.dtype == jnp.float32 and x.ndim == 4 for x in (q_bgrd, k_bgsd, v_bgsd))
          and q_bgrd.shape[-1] % 8 == 0 and library.usable())


def attend(q_bgrd: jax.Array, k_bgsd: jax.Array, v_bgsd: jax.Array,
           valid: jax.Array) -> jax.Array:
  """``softmax(q k^T over the valid slots) v`` -> [batch, kv_heads, rows, head_dim], zeros
  for a row without a valid slot; ``q`` already scaled (check ``applies`` first). ``valid``:
  bool [batch, slots] for every query row of a batch row (a cache), or [batch, kv_heads, rows,
  slots], each row its own (a prompt's causal or prefix masks)."""
  out = jax.ShapeDtypeStruct(q_bgrd.shape, jnp.float32)
  return jax.ffi.ffi_call(library.CACHE_ATTENTION, out, vmap_method="sequential")(
      q_bgrd, k_bgsd, v_bgsd, valid)
