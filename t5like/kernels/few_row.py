"""The decode step's few-row float32 products on CPU (``few_row.cc``).

``y [M, N] = a [M, K] w [N, K]^T`` for a few rows M reads all of ``w`` per product: a decode step
is bound by how fast its weights stream. XLA:CPU's dot kernels stream them at ~10-13 GB/s at
eight rows on a 2-core AVX2 host that reads ~30 GB/s; the kernel ~16 (docs/performance.md).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from t5like.kernels import library

# Measured faster up to here (16 rows: 9.9 against XLA's 7.6 GB/s); the kernel streams w once
# per 8 rows, so larger batches, not measured, keep XLA's dot.
MAX_ROWS = 16


def applies(a_mk: jax.Array, w_nk: jax.Array) -> bool:
  """Whether ``matmul`` serves this product: float32, K a multiple of 8, at most ``MAX_ROWS``
  rows, and the kernels usable (``library.usable``)."""
  return (a_mk.dtype == jnp.float32 and w_nk.dtype == jnp.float32
          and a_mk.ndim == 2 and w_nk.ndim == 2 and a_mk.shape[1] == w_nk.shape[1]
          and a_mk.shape[1] % 8 == 0 and 1 <= a_mk.shape[0] <= MAX_ROWS and library.usable())


def matmul(a_mk: jax.Array, w_nk: jax.Array) -> jax.Array:
  """``a [M, K] w [N, K]^T -> [M, N]`` in float32 on the kernel (check ``applies`` first)."""
  return fused_matmul(a_mk, w_nk)


def fused_matmul(a_mk: jax.Array, w_nk: jax.Array, *, norm_scale: jax.Array | None = None,
                 eps: float = 0.0, factor: float = 1.0, glu: bool = False,
                 residual: jax.Array | None = None) -> jax.Array:
  """``matmul`` with a decode step's neighbouring operations: ``a``'s rows RMS-normed first
  (``x / rms(x) * norm_scale``, as ``norms.RMSNorm``) and times ``factor``; with ``glu`` the
  result's halves gated, ``silu(y[:, :N/2]) * y[:, N/2:]`` -> [M, N / 2] (SwiGLU's gate | up);
  plus ``residual``. One call for up to six small XLA operations around the product. Check
  ``applies`` first."""
  m, n = a_mk.shape[0], w_nk.shape[0] // 2 if glu else w_nk.shape[0]
  none = jnp.zeros((0,), jnp.float32)
  out = jax.ShapeDtypeStruct((m, n), jnp.float32)
  return jax.ffi.ffi_call(library.FEW_ROW_FUSED, out, vmap_method="sequential")(
      a_mk, none if norm_scale is None else norm_scale.astype(jnp.float32), w_nk,
      none if residual is None else residual.astype(jnp.float32),
      norm=np.int32(norm_scale is not None), eps=np.float32(eps), factor=np.float32(factor),
      glu=np.int32(glu), add=np.int32(residual is not None))
