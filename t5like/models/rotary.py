"""Rotary position embedding on explicit positions (so any offset works: RedLLM's continuous
positions rotate decoder queries by ``k + t`` and encoder keys by ``j``).

Feature pairs (i, i + d/2) of a query or key at position p are rotated by the angle
``p * max_wavelength^(-2i / d)``; the score between a query at p and a key at q then depends
only on p - q. A forward pass computes the sine and cosine of its positions once
(``rotary_table``) and every layer's queries and keys read them (``ops.reference.rope``).
"""
from __future__ import annotations

import jax

from t5like.ops import Reference, Rotary
from t5like.ops import reference

__all__ = ["Rotary", "apply_rope", "as_rotary", "rotary_table"]


def rotary_table(ops: Reference, positions_bt: jax.Array, head_dim: int,
                 max_wavelength: float) -> Rotary:
  """The rotation of ``positions_bt`` [batch, length], for every layer of a forward to read."""
  return ops.rotary_table(positions_bt, head_dim, max_wavelength)


def as_rotary(positions_bt: jax.Array | Rotary, head_dim: int, max_wavelength: float) -> Rotary:
  """``positions_bt``'s rotation: a ``rotary_table`` as it is, integer positions computed."""
  if isinstance(positions_bt, Rotary):
    return positions_bt
  return reference.rotation(positions_bt, head_dim, max_wavelength)


def apply_rope(x_bthd: jax.Array, positions_bt: jax.Array | Rotary,
               max_wavelength: float) -> jax.Array:
  """Rotates ``x [batch, length, heads, head_dim]`` by its positions (integer [batch, length]
  or their ``rotary_table``)."""
  return reference.rope(x_bthd, as_rotary(positions_bt, x_bthd.shape[-1], max_wavelength))
