"""Rotary position embedding on explicit positions (so any offset works: RedLLM's continuous
positions rotate decoder queries by ``k + t`` and encoder keys by ``j``)."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def apply_rope(x_bthd: jax.Array, positions_bt: jax.Array, max_wavelength: float) -> jax.Array:
  """Rotates feature pairs (i, i + d/2) of ``x[batch, length, heads, head_dim]`` by position.

  The score between a query at p and a key at q then depends only on p - q.
  """
  head_dim = x_bthd.shape[-1]
  half = head_dim // 2
  inv_freq = max_wavelength ** (-jnp.arange(half, dtype=jnp.float32) * 2.0 / head_dim)  # [half]
  angle_bth = positions_bt.astype(jnp.float32)[:, :, None] * inv_freq  # [batch, length, half]
  sin = jnp.sin(angle_bth)[:, :, None, :]  # [batch, length, 1, half]
  cos = jnp.cos(angle_bth)[:, :, None, :]
  x = x_bthd.astype(jnp.float32)
  x1, x2 = x[..., :half], x[..., half:]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_bthd.dtype)
