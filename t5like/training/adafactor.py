"""Adafactor's second-moment scaling: optax's ``scale_by_factored_rms`` with ``rsqrt``.

optax writes ``v ** -0.5``, which XLA keeps as a ``power`` op; on XLA:CPU that is a scalar
``powf`` per element, 15x slower than ``rsqrt`` (a fused update of a million elements: 5.6
against 0.37 ms on a 2-core AMD EPYC), and every unfactored array pays it each step. The small
configs' attention kernels (head_dim 64 < ``min_dim_size_to_factor``) are all unfactored: 45 ->
14 thread-ms a step with ``rsqrt`` (small DecLLM, f32; the rest is the memory pass). Hence this
copy of its update (same rule, same state: optax's ``init`` and ``FactoredState``, so
checkpoints do not change); it equals optax's to rounding (tests/training).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax


def factored_dims(shape: tuple[int, ...], min_dim: int) -> tuple[int, int] | None:
  """(second largest, largest) dims that Adafactor factors, or None (optax's rule)."""
  if len(shape) < 2:
    return None
  order = np.argsort(shape)
  if shape[order[-2]] < min_dim:
    return None
  return int(order[-2]), int(order[-1])


class _Out:
  """One array's (update, v_row, v_col, v): not a pytree node, so tree.map keeps it whole."""

  def __init__(self, *parts):
    self.parts = parts


def _decay_rate(count: jax.Array, exponent: float) -> jax.Array:
  """``1 - (t + 1)^-exponent`` (Adafactor's second-moment decay; a scalar, as in optax)."""
  return 1.0 - jnp.asarray(count + 1, jnp.float32) ** (-exponent)


def _update(grad, v_row, v_col, v, decay, min_dim: int, epsilon: float):
  """One array: (update, v_row, v_col, v) as optax computes them, ``rsqrt`` for ``** -0.5``."""
  grad_sqr = grad * grad + epsilon
  dims = factored_dims(grad.shape, min_dim)
  if dims is None:
    new_v = (decay * v + (1.0 - decay) * grad_sqr).astype(v.dtype)
    return _Out(grad * jax.lax.rsqrt(new_v), v_row, v_col, new_v)
  d1, d0 = dims  # d0 the largest dimension, d1 the second largest.
  new_row = (decay * v_row + (1.0 - decay) * jnp.mean(grad_sqr, axis=d0)).astype(v_row.dtype)
  new_col = (decay * v_col + (1.0 - decay) * jnp.mean(grad_sqr, axis=d1)).astype(v_col.dtype)
  reduced_d1 = d1 - 1 if d1 > d0 else d1
  row_factor = jax.lax.rsqrt(new_row / jnp.mean(new_row, axis=reduced_d1, keepdims=True))
  col_factor = jax.lax.rsqrt(new_col)
  update = grad * jnp.expand_dims(row_factor, d0) * jnp.expand_dims(col_factor, d1)
  return _Out(update, new_row, new_col, v)


def scale_by_factored_rms(decay_rate: float = 0.8, min_dim_size_to_factor: int = 128,
                          epsilon: float = 1e-30) -> optax.GradientTransformation:
  """``optax.scale_by_factored_rms(factored=True, step_offset=0, ...)`` computed with rsqrt."""
  reference = optax.scale_by_factored_rms(
      factored=True, decay_rate=decay_rate, step_offset=0,
      min_dim_size_to_factor=min_dim_size_to_factor, epsilon=epsilon)

  def update_fn(grads: Any, state: optax.FactoredState, params: Any = None):
    del params  # optax requires them only to read shapes, which the gradients have too.
    decay = _decay_rate(state.count, decay_rate)
    out = jax.tree.map(
        lambda g, r, c, v: _update(g, r, c, v, decay, min_dim_size_to_factor, epsilon),
        grads, state.v_row, state.v_col, state.v)
    pick = lambda i: jax.tree.map(lambda o: o.parts[i], out)  # noqa: E731
    return pick(0), optax.FactoredState(count=optax.safe_increment(state.count),
                                        v_row=pick(1), v_col=pick(2), v=pick(3))

  return optax.GradientTransformation(reference.init, update_fn)
