"""RMSNorm (T5X's "LayerNorm": no mean subtraction, learned scale), used pre-norm everywhere."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from t5like.models.layers import Axes, param


class RMSNorm(nnx.Module):
  """Normalises over the trailing ``len(shape)`` axes: ``x / rms(x) * scale``.

  ``shape=(d,)`` is the usual norm; ``shape=(head_dim,)`` normalises each head on its own (Q/K/V
  norms, per-head output norm); ``shape=(heads, head_dim)`` normalises all heads together.
  """

  def __init__(self, shape: tuple[int, ...], axes: Axes, *, eps: float, param_dtype: str,
               rngs: nnx.Rngs):
    self.eps = eps
    self.scale = param(rngs, nnx.initializers.ones, shape, axes, param_dtype)

  def __call__(self, x: jax.Array) -> jax.Array:
    n = self.scale.ndim
    red = tuple(range(x.ndim - n, x.ndim))
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=red, keepdims=True) + self.eps)
    return (y * self.scale[...].astype(jnp.float32)).astype(x.dtype)
