"""Greedy decoding's argmax over float32 logits on CPU (``argmax.cc``).

XLA:CPU's argmax over a decode step's ``[8, 8192]`` logits is a variadic reduce taking 55-85 us a
step; the kernel's two vector passes a few (docs/performance.md).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from t5like.kernels import library


def applies(x_bv: jax.Array) -> bool:
  """Whether ``argmax`` serves these logits: float32 ``[batch, vocab]`` and the kernels usable
  (``library.usable``)."""
  return x_bv.dtype == jnp.float32 and x_bv.ndim == 2 and library.usable()


def argmax(x_bv: jax.Array) -> jax.Array:
  """int32 [batch]: ``jnp.argmax(x, axis=-1)`` (first maximum; the first NaN where there is
  one), check ``applies`` first."""
  out = jax.ShapeDtypeStruct(x_bv.shape[:1], jnp.int32)
  return jax.ffi.ffi_call(library.ARGMAX, out, vmap_method="sequential")(x_bv)
