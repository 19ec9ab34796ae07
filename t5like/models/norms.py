"""RMSNorm (T5X's "LayerNorm": no mean subtraction, learned scale), used pre-norm everywhere."""
from __future__ import annotations

import functools

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
    scale = self.scale[...]
    y = rms_norm(x.astype(jnp.float32), scale.astype(jnp.float32), scale.ndim, self.eps)
    return y.astype(x.dtype)


# A hand-written VJP: autodiff of the formula makes XLA:CPU broadcast `scale` and `rsqrt` to
# full size for its backward reductions; this backward has one reduction for `x` and one for
# `scale`. The small train steps keep ~6 % less in temporary buffers (docs/performance.md).
@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def rms_norm(x: jax.Array, scale: jax.Array, n: int, eps: float) -> jax.Array:
  """``x * rsqrt(mean(x^2) + eps) * scale`` over the trailing ``n`` axes (float32 in, out)."""
  return _normalise(x, n, eps)[0] * scale


def _normalise(x, n, eps):
  """(x * r, r) with r = rsqrt(mean(x^2) + eps) over the trailing n axes, keepdims."""
  r = jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=tuple(range(x.ndim - n, x.ndim)),
                             keepdims=True) + eps)
  return x * r, r


def _rms_norm_fwd(x, scale, n, eps):
  xr, r = _normalise(x, n, eps)
  return xr * scale, (x, scale, r)


def _rms_norm_bwd(n, eps, residuals, dy):
  # y = x r s, r = (mean(x^2) + eps)^-1/2  =>  dx = r (g - x r^2 mean(g x)) with g = dy s,
  # ds = sum over the leading axes of dy x r.
  x, scale, r = residuals
  xr = x * r
  g = dy * scale
  dx = r * (g - xr * jnp.mean(g * xr, axis=tuple(range(x.ndim - n, x.ndim)), keepdims=True))
  dscale = jnp.sum(dy * xr, axis=tuple(range(x.ndim - n)))
  return dx, dscale


rms_norm.defvjp(_rms_norm_fwd, _rms_norm_bwd)
