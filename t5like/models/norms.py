"""RMSNorm (T5X's "LayerNorm": no mean subtraction, learned scale), used pre-norm everywhere."""
from __future__ import annotations

import jax
from flax import nnx

from t5like.models.layers import Axes, param
from t5like.ops import Reference


class RMSNorm(nnx.Module):
  """``x / sqrt(mean(x^2) + eps) * scale`` over the trailing ``len(shape)`` axes, in float32.

  ``shape=(d,)`` is the usual norm; ``shape=(head_dim,)`` normalises each head on its own (Q/K/V
  norms, per-head output norm); ``shape=(heads, head_dim)`` normalises all heads together.
  """

  def __init__(self, shape: tuple[int, ...], axes: Axes, *, eps: float, param_dtype: str,
               ops: Reference, rngs: nnx.Rngs):
    self.eps = eps
    self.ops = ops
    self.scale = param(rngs, nnx.initializers.ones, shape, axes, param_dtype)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.ops.rms_norm(x, self.scale[...], self.eps)
