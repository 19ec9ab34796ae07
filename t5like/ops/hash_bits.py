"""Dropout's random bits: a keyed integer hash of each element's index.

Written by hand because neither of JAX's generators suits a dropout mask on TPU: threefry (the
default, with ``jax_threefry_partitionable``) runs a full 20-round Threefry-2x32, ~100 integer
operations, per element drawn, fused into every dropout site, forward, recomputed and backward:
a quarter to a third of the instruction-tuning configs' compile; ``rbg`` (XLA's
``RngBitGenerator``) is materialised by XLA:TPU instead of fused (docs/compile.md). This is
counter-based like threefry: each element's bits depend only on the key and the element's
index in the global array, so every device of a sharded program computes its own
slice of the same mask, in the same fused kernel as the dropout, and a remat recomputes it
exactly. Two rounds of ``lowbias32`` (Chris Wellons' hash-prospector integer hash: xor-shift,
multiply, xor-shift, multiply, xor-shift) are ~20 operations per element.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

_WORD = 2 ** 32


def mix32(x: jax.Array) -> jax.Array:
  """``lowbias32``: a bijection of uint32 whose output bits each flip with ~1/2 probability
  when any input bit flips."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x7FEB352D)
  x = x ^ (x >> 15)
  x = x * jnp.uint32(0x846CA68B)
  return x ^ (x >> 16)


def counters(shape: tuple[int, ...], limit: int = _WORD) -> tuple[jax.Array, jax.Array]:
  """Each element's index as two uint32 words (high, low): ``low`` is the row-major index over
  the longest run of trailing axes with at most ``limit`` elements, ``high`` over the rest.
  Distinct elements get distinct pairs (an array beyond ``limit`` elements does not repeat)."""
  split = len(shape)
  while split > 0 and math.prod(shape[split - 1:]) <= limit:
    split -= 1
  if (shape and split == len(shape)) or math.prod(shape[:split]) > limit:
    raise ValueError(f"dropout over an array of shape {shape}: an axis or the leading axes hold "
                     f"more than {limit} elements, more than two 32-bit counter words index")

  def flat(axes: range) -> jax.Array:
    index = jnp.zeros(shape, jnp.uint32)
    for ax in axes:
      index = index * jnp.uint32(shape[ax]) + jax.lax.broadcasted_iota(jnp.uint32, shape, ax)
    return index

  return flat(range(split)), flat(range(split, len(shape)))


def uniform_bits(rng: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """uint32 bits per element of ``shape``, fixed by ``rng`` (a JAX PRNG key) and the index."""
  k_lo, k_hi = jax.random.bits(rng, (2,), jnp.uint32)  # Threefry once, for two key words.
  high, low = counters(tuple(shape))
  return mix32(mix32(low ^ k_lo) ^ (high * jnp.uint32(0x9E3779B9)) ^ k_hi)
