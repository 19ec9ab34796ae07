"""Attention's QKV norm and the RoPE rotation after it, forward and backward, on one CPU device
(``head_norm.cc``), as ``models/norms.py::RMSNorm`` then ``models/rotary.py::apply_rope``
compute them: float32 out of float32 or bfloat16 projections.

XLA:CPU runs the pair as about ten kernels a layer over ``[batch, length, heads, head_dim]``
float32 (casts, the norm's reductions with its scale broadcast to full size, the rotation's
halves and their concatenation); the kernel reads each head's vector once, forward and backward
(docs/performance.md).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from t5like.kernels import library


def applies(x_bthd: jax.Array, rot=None) -> bool:
  """Whether ``norm_rope`` serves ``x`` [batch, length, heads, head_dim] (float32 or bfloat16,
  head_dim a multiple of 16) with ``rot`` (a ``Rotary`` table [batch, length, 1, head_dim / 2],
  or None: the norm alone), and the kernels are usable on one device."""
  if x_bthd.ndim != 4 or x_bthd.dtype not in (jnp.float32, jnp.bfloat16):
    return False
  b, t, _, d = x_bthd.shape
  return (d % 16 == 0 and (rot is None or all(
      a.shape == (b, t, 1, d // 2) and a.dtype == jnp.float32 for a in (rot.sin, rot.cos)))
      and library.usable_on_one_device())


def norm_rope(x_bthd: jax.Array, scale_d: jax.Array, rot, eps: float) -> jax.Array:
  """``rotate(x * rsqrt(mean(x^2) + eps) * scale)`` per head vector, float32 [b, t, h, d];
  ``rot`` None: no rotation. Check ``applies`` first."""
  if rot is None:
    sin = cos = jnp.zeros((0,), jnp.float32)
  else:  # Positions carry no gradient.
    sin, cos = (jax.lax.stop_gradient(a) for a in (rot.sin, rot.cos))
  return _norm_rope(x_bthd, scale_d.astype(jnp.float32), sin, cos, float(eps))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _norm_rope(x, scale, sin, cos, eps):
  return _forward(x, scale, sin, cos, eps)


def _forward(x, scale, sin, cos, eps):
  library.built()  # Registers the targets (``applies`` does too).
  call = jax.ffi.ffi_call(library.HEAD_NORM_FWD, jax.ShapeDtypeStruct(x.shape, jnp.float32),
                          vmap_method="sequential")
  return call(x, scale, sin, cos, eps=np.float32(eps))


def _fwd(x, scale, sin, cos, eps):
  return _forward(x, scale, sin, cos, eps), (x, scale, sin, cos)


def _bwd(eps, res, dy):
  x, scale, sin, cos = res
  call = jax.ffi.ffi_call(library.HEAD_NORM_BWD,
                          (jax.ShapeDtypeStruct(x.shape, x.dtype),
                           jax.ShapeDtypeStruct(scale.shape, jnp.float32)),
                          vmap_method="sequential")
  dx, dscale = call(x, scale, sin, cos, dy.astype(jnp.float32), eps=np.float32(eps))
  return dx, dscale, jnp.zeros_like(sin), jnp.zeros_like(cos)


_norm_rope.defvjp(_fwd, _bwd)
