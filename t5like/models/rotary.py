"""Rotary position embedding on explicit positions (so any offset works: RedLLM's continuous
positions rotate decoder queries by ``k + t`` and encoder keys by ``j``).

A forward pass computes the sine and cosine of its positions once (``rotary_table``, [batch,
length, half] values) and every layer rotates its queries and keys with them: computed inside each
layer instead, XLA fused the sin/cos into every rotation of ``[batch, length, heads, head_dim]``,
forward and backward — transcendental work repeated per head and per layer (docs/performance.md).
The decode step's one token per row gets a table too, once per step for all layers.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from t5like.models.layers import on_cpu


class Rotary(NamedTuple):
  """Rotation of every position: float32 [batch, length, 1, head_dim / 2] each."""
  sin: jax.Array
  cos: jax.Array


def _rotation(positions_bt: jax.Array, head_dim: int, max_wavelength: float) -> Rotary:
  """sin / cos of ``position * max_wavelength^(-2i / head_dim)`` for feature pairs i < d/2."""
  half = head_dim // 2
  inv_freq = max_wavelength ** (-jnp.arange(half, dtype=jnp.float32) * 2.0 / head_dim)  # [half]
  angle_bth = positions_bt.astype(jnp.float32)[:, :, None] * inv_freq  # [batch, length, half]
  return Rotary(jnp.sin(angle_bth)[:, :, None, :], jnp.cos(angle_bth)[:, :, None, :])


def rotary_table(positions_bt: jax.Array, head_dim: int, max_wavelength: float) -> Rotary:
  """The rotation of ``positions_bt`` as a table for every layer of a forward pass to read."""
  rotation = lambda p: tuple(_rotation(p, head_dim, max_wavelength))  # noqa: E731
  if not on_cpu() or positions_bt.size == 0:
    # The barrier keeps the table a buffer: without it XLA fuses sin/cos back into every consumer.
    return Rotary(*jax.lax.optimization_barrier(rotation(positions_bt)))
  # XLA:CPU drops optimization barriers before it fuses, so the unrolled layers (a scanned stack
  # reads the table as a loop input) recomputed sin/cos per head and layer, forward and backward:
  # 5.3 ms per rotation of [8, 256, 8, 64] against 0.4 from a table. A conditional is opaque to
  # fusion; both branches are the rotation, so the predicate only has to be unknown when compiling.
  return Rotary(*jax.lax.cond(positions_bt.reshape(-1)[0] > 0, rotation, rotation, positions_bt))


def as_rotary(positions_bt: jax.Array | Rotary, head_dim: int, max_wavelength: float) -> Rotary:
  """``positions_bt``'s rotation: a ``rotary_table`` as it is, integer positions computed."""
  if isinstance(positions_bt, Rotary):
    return positions_bt
  return _rotation(positions_bt, head_dim, max_wavelength)


def apply_rope(x_bthd: jax.Array, positions_bt: jax.Array | Rotary,
               max_wavelength: float) -> jax.Array:
  """Rotates feature pairs (i, i + d/2) of ``x[batch, length, heads, head_dim]`` by position
  (integer positions [batch, length], or their ``rotary_table``).

  The score between a query at p and a key at q then depends only on p - q.
  """
  half = x_bthd.shape[-1] // 2
  rot = as_rotary(positions_bt, x_bthd.shape[-1], max_wavelength)
  x = x_bthd.astype(jnp.float32)
  x1, x2 = x[..., :half], x[..., half:]
  out = jnp.concatenate([x1 * rot.cos - x2 * rot.sin, x2 * rot.cos + x1 * rot.sin], axis=-1)
  return out.astype(x_bthd.dtype)
