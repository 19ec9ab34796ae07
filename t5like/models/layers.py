"""Small shared helpers: parameters with logical axes, activation constraints, dropout, dtypes."""
from __future__ import annotations

import math
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import nnx

Axes = tuple[str | None, ...]


def dtype(name: str) -> jnp.dtype:
  return jnp.dtype(name)


def param(rngs: nnx.Rngs, init: Callable, shape: Sequence[int], axes: Axes,
          param_dtype: str) -> nnx.Param:
  """A parameter tagged with logical axis names (mapped to the mesh by t5like.partitioning).

  Eager sharding is off: the trainer builds the state abstractly and lets `jax.jit` place it.
  """
  assert len(axes) == len(shape), (shape, axes)
  value = init(rngs.params(), tuple(shape), dtype(param_dtype))
  return nnx.Param(value, out_sharding=tuple(axes), eager_sharding=False)


def constrain(x: jax.Array, axes: Axes) -> jax.Array:
  """Logical sharding constraint on an activation; a no-op outside a mesh + rules context."""
  return nn.with_logical_constraint(x, axes)


def project(x: jax.Array, w: jax.Array, n_contract: int = 1, *,
            preferred_element_type=None) -> jax.Array:
  """``x [..., *c] @ w [*c, *o] -> [..., *o]`` (the last ``n_contract`` axes of ``x`` against the
  first of ``w``) as one 2-D matmul ``[N, K] x [K, M]``.

  Same contraction as the einsum, written so XLA:CPU takes its fast matmul path forward and
  backward: with [batch, length, ...] operands the weight gradient contracts over two axes and
  the SwiGLU MLP ran ~1.7x slower (``benchmarks/step_breakdown.py``). The reshapes merge the
  major axes only, so sharded batch/heads axes stay sharded.
  """
  lead, contract, out = x.shape[:x.ndim - n_contract], x.shape[x.ndim - n_contract:], \
      w.shape[n_contract:]
  k = math.prod(contract)
  assert tuple(w.shape[:n_contract]) == tuple(contract), (x.shape, w.shape)
  y = jnp.matmul(x.reshape(-1, k), w.reshape(k, -1), preferred_element_type=preferred_element_type)
  return y.reshape(*lead, *out)


def dropout(x: jax.Array, rate: float, rng: jax.Array | None) -> jax.Array:
  """Inverted dropout; identity when ``rng`` is None (deterministic) or ``rate`` is 0."""
  if rng is None or rate == 0.0:
    return x
  keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape)
  return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


def fold(rng: jax.Array | None, *data: int | jax.Array) -> jax.Array | None:
  """Derives an independent key per (layer, site); passes None through."""
  if rng is None:
    return None
  for d in data:
    rng = jax.random.fold_in(rng, d)
  return rng


def fan_in_init(fan_in: int) -> Callable:
  """Normal init with std 1/sqrt(fan_in), the T5X/MaxText default for dense kernels."""
  return nnx.initializers.normal(stddev=fan_in ** -0.5)
