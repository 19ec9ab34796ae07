"""Small shared helpers: parameters with logical axes, activation constraints, dropout, dtypes."""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import nnx

from t5like.ops.reference import dropout, fold  # noqa: F401  (the model's dropout and rng folds)

Axes = tuple[str | None, ...]
COMPUTE_CAST = "cast_to_compute"  # Parameter metadata: see ``param``.


def dtype(name: str) -> jnp.dtype:
  return jnp.dtype(name)


def param(rngs: nnx.Rngs, init: Callable, shape: Sequence[int], axes: Axes,
          param_dtype: str, cast_to_compute: bool = False) -> nnx.Param:
  """A parameter tagged with logical axis names (mapped to the mesh by t5like.partitioning).

  Eager sharding is off: the trainer builds the state abstractly and lets `jax.jit` place it.
  ``cast_to_compute``: every use casts it to the compute dtype (`model.dtype`) first (the dense
  kernels, the embedding tables), so generation may hold it in that dtype (``COMPUTE_CAST``).
  """
  assert len(axes) == len(shape), (shape, axes)
  value = init(rngs.params(), tuple(shape), dtype(param_dtype))
  extra = {COMPUTE_CAST: True} if cast_to_compute else {}
  return nnx.Param(value, out_sharding=tuple(axes), eager_sharding=False, **extra)


def constrain(x: jax.Array, axes: Axes) -> jax.Array:
  """Logical sharding constraint on an activation; a no-op outside a mesh + rules context."""
  return nn.with_logical_constraint(x, axes)


def ruled(axis: str) -> bool:
  """Whether the active rule table maps logical ``axis`` (some are there only for some chips,
  t5like/partitioning.py)."""
  return any(name == axis for name, _ in nn.get_logical_axis_rules())


def fan_in_init(fan_in: int) -> Callable:
  """Normal init with std 1/sqrt(fan_in), the T5X/MaxText default for dense kernels."""
  return nnx.initializers.normal(stddev=fan_in ** -0.5)
