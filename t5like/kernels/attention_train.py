"""The attention core of a train step on one CPU device, float32, forward and backward
(``attention_train.cc``), as ``models/attention.py::dot_product_attention`` computes it.

XLA:CPU runs the core as batched products on heads-major copies of q, k and v with the softmax,
its mask and their gradients as separate passes over ``[batch, heads, q, kv]`` arrays; the kernel
keeps a (batch, kv head) pair's work in cache and skips each query's keys outside its first to
last allowed one (docs/performance.md).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from t5like.kernels import library

RESIDUALS = "attention_core"  # checkpoint_name of the output and log-sum-exp the backward reads.
DTYPES = (jnp.float32, jnp.bfloat16)  # bfloat16 operands are computed in float32.
MAX_SCORES = 1 << 22  # Scores per (batch, kv head) pair: the kernel keeps 2 such arrays a thread.


def applies(q_bthk: jax.Array, k_bsgk: jax.Array, v_bsgk: jax.Array,
            mask_bhts: jax.Array) -> bool:
  """Whether ``attend`` serves these operands: float32 q, k, v of the same head size (a
  multiple of 8), kv heads dividing the heads, a bool mask ``[batch|1, heads|1, t, s]``, key
  lengths a multiple of 8 and query lengths of 4, at most ``MAX_SCORES`` scores per (batch, kv
  head), and the kernels usable on one device (``library.usable_on_one_device``)."""
  if not (q_bthk.dtype in DTYPES and all(x.dtype == q_bthk.dtype and x.ndim == 4
                                          for x in (q_bthk, k_bsgk, v_bsgk))):
    return False
  b, t, h, d = q_bthk.shape
  _, s, g, _ = k_bsgk.shape
  return (k_bsgk.shape == v_bsgk.shape and k_bsgk.shape[0] == b and k_bsgk.shape[3] == d
          and h % g == 0 and d % 8 == 0 and s % 8 == 0 and t % 4 == 0
          and mask_bhts.dtype == jnp.bool_ and mask_bhts.ndim == 4
          and mask_bhts.shape[0] in (1, b) and mask_bhts.shape[1] in (1, h)
          and mask_bhts.shape[2:] == (t, s) and h // g * t * s <= MAX_SCORES
          and library.usable_on_one_device())


def attend(q_bthk: jax.Array, k_bsgk: jax.Array, v_bsgk: jax.Array,
           mask_bhts: jax.Array) -> jax.Array:
  """``softmax(q k^T / sqrt(head_dim) over the allowed keys) v`` -> [batch, t, heads, head_dim]
  in q's dtype; zeros for a query with no allowed key. Check ``applies`` first."""
  f32 = (x.astype(jnp.float32) for x in (q_bthk, k_bsgk, v_bsgk))
  return _attend(*f32, mask_bhts).astype(q_bthk.dtype)


@jax.custom_vjp
def _attend(q_bthk, k_bsgk, v_bsgk, mask_bhts):
  return _forward(q_bthk, k_bsgk, v_bsgk, mask_bhts)[0]


def _full_mask(q_bthk, mask_bhts):
  b = q_bthk.shape[0]
  return jnp.broadcast_to(mask_bhts, (b,) + mask_bhts.shape[1:])


def _forward(q_bthk, k_bsgk, v_bsgk, mask_bhts):
  library.built()  # Registers the targets (``applies`` does too).
  b, t, h, _ = q_bthk.shape
  shapes = (jax.ShapeDtypeStruct(q_bthk.shape, jnp.float32),
            jax.ShapeDtypeStruct((b, h, t), jnp.float32))  # log-sum-exp of each query's scores
  call = jax.ffi.ffi_call(library.ATTENTION_TRAIN_FWD, shapes, vmap_method="sequential")
  return call(q_bthk, k_bsgk, v_bsgk, _full_mask(q_bthk, mask_bhts))


def _fwd(q_bthk, k_bsgk, v_bsgk, mask_bhts):
  out_bthk, lse_bht = _forward(q_bthk, k_bsgk, v_bsgk, mask_bhts)
  # Named, so a remat policy can keep them rather than run the forward again for the backward.
  out_bthk, lse_bht = (checkpoint_name(x, RESIDUALS) for x in (out_bthk, lse_bht))
  return out_bthk, (q_bthk, k_bsgk, v_bsgk, mask_bhts, out_bthk, lse_bht)


def _bwd(res, dout_bthk):
  q_bthk, k_bsgk, v_bsgk, mask_bhts, out_bthk, lse_bht = res
  shapes = (jax.ShapeDtypeStruct(q_bthk.shape, jnp.float32),
            jax.ShapeDtypeStruct(k_bsgk.shape, jnp.float32),
            jax.ShapeDtypeStruct(v_bsgk.shape, jnp.float32))
  call = jax.ffi.ffi_call(library.ATTENTION_TRAIN_BWD, shapes, vmap_method="sequential")
  dq, dk, dv = call(q_bthk, k_bsgk, v_bsgk, _full_mask(q_bthk, mask_bhts), out_bthk, lse_bht,
                    dout_bthk.astype(jnp.float32))
  return dq, dk, dv, None


_attend.defvjp(_fwd, _bwd)
