"""SwiGLU feed-forward: ``(silu(x W_gate) * (x W_up)) W_down``."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from t5like.config.model import ModelConfig
from t5like.models.layers import (constrain, dropout, dtype, fan_in_init, fold, kernel, param,
                                  project)


class SwiGLU(nnx.Module):
  KERNELS = {"wi_gate": 1, "wi_up": 1, "wo": 1}  # Kernel -> its contracted (leading) axes.

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, f = cfg.d_model, cfg.d_ff
    self.cfg = cfg
    self.wi_gate = param(rngs, fan_in_init(d), (d, f), ("embed", "mlp"), cfg.param_dtype)
    self.wi_up = param(rngs, fan_in_init(d), (d, f), ("embed", "mlp"), cfg.param_dtype)
    self.wo = param(rngs, fan_in_init(f), (f, d), ("mlp", "embed"), cfg.param_dtype)

  def __call__(self, x_btd: jax.Array, *, rng: jax.Array | None = None) -> jax.Array:
    dt = dtype(self.cfg.dtype)
    x = x_btd.astype(dt)
    gate_btf = project(x, kernel(self.wi_gate, dt))
    up_btf = project(x, kernel(self.wi_up, dt))
    return self.combine(gate_btf, up_btf, rng=rng)

  def combine(self, gate_btf: jax.Array, up_btf: jax.Array, *,
              rng: jax.Array | None = None) -> jax.Array:
    """The MLP after its two input products: ``silu(gate) * up``, then ``down``."""
    return self.down(jax.nn.silu(gate_btf) * up_btf, rng=rng)

  def down(self, h_btf: jax.Array, *, rng: jax.Array | None = None) -> jax.Array:
    """The MLP after its gating: (dropout,) ``W_down``: [b, t, f] -> [b, t, d]."""
    h_btf = constrain(h_btf, ("batch", "length", "mlp"))
    h_btf = dropout(h_btf, self.cfg.dropout_rate, fold(rng, 0))
    return project(h_btf, kernel(self.wo, dtype(self.cfg.dtype)))
