"""Attention of a few query rows per (batch, kv head) over their keys/values, float32 on CPU
(``cache_attention.cc``): the decode step's one token per row over its cache, and the prefill's
prompt under its mask.

The decode step's attention is two batched products with one query row per (batch, head) and a
masked softmax between them, which XLA:CPU runs on Eigen at ~11-15 GB/s; the kernel reads each
pair's keys and values once, at the valid slots only (docs/performance.md).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

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


def step_applies(qkv_bn: jax.Array, k_bgsd: jax.Array, v_bgsd: jax.Array) -> bool:
  """Whether ``attend_step`` serves a decode step's self-attention: ``applies``' conditions on
  float32 ``[batch, (heads + 2 kv_heads) head_dim]`` products and caches."""
  return (qkv_bn.dtype == jnp.float32 and qkv_bn.ndim == 2 and k_bgsd.ndim == 4
          and k_bgsd.dtype == v_bgsd.dtype == jnp.float32 and k_bgsd.shape[-1] % 8 == 0
          and qkv_bn.shape[1] % k_bgsd.shape[-1] == 0 and library.usable())


def attend_step(qkv_bn: jax.Array, scales_3d: jax.Array | None, eps: float,
                rope_2bh: jax.Array | None, k_bgsd: jax.Array, v_bgsd: jax.Array,
                slot: jax.Array | int, valid_bs: jax.Array
                ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """One new token per row after its ``q | k | v`` product ``qkv`` [batch, (heads + 2 kv_heads)
  * head_dim]: its key and value normed (``scales`` [3, head_dim]: the q, k, v RMSNorm scales,
  or None for no norm), the key rotated (``rope`` [2, batch, head_dim / 2]: sin, cos; None for
  none) and both written into the caches at ``slot`` (in place); then the query heads, normed,
  rotated and scaled by head_dim^-1/2, over the valid slots (``valid`` with ``slot`` marked).
  Returns (out [batch, kv_heads, heads / kv_heads, head_dim], k cache, v cache). Check
  ``step_applies`` first."""
  b, g, _, d = k_bgsd.shape
  h = qkv_bn.shape[1] // d - 2 * g
  def f32(x, shape):  # An absent operand: zeros the kernel does not read.
    return jnp.zeros(shape, jnp.float32) if x is None else x.astype(jnp.float32)
  shapes = (jax.ShapeDtypeStruct((b, g, h // g, d), jnp.float32),
            jax.ShapeDtypeStruct(k_bgsd.shape, jnp.float32),
            jax.ShapeDtypeStruct(v_bgsd.shape, jnp.float32))
  call = jax.ffi.ffi_call(library.ATTENTION_STEP, shapes, vmap_method="sequential",
                          input_output_aliases={3: 1, 4: 2})
  return call(qkv_bn, f32(scales_3d, (3, d)), f32(rope_2bh, (2, b, d // 2)), k_bgsd, v_bgsd,
              jnp.asarray(slot, jnp.int32), valid_bs, norm=np.int32(scales_3d is not None),
              rope=np.int32(rope_2bh is not None), eps=np.float32(eps))
