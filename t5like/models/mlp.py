"""SwiGLU feed-forward: ``(silu(x W_gate) * (x W_up)) W_down``."""
from __future__ import annotations

import jax
from flax import nnx

from t5like import ops as ops_lib
from t5like.config.model import ModelConfig
from t5like.models.layers import constrain, dropout, dtype, fan_in_init, fold, param


class SwiGLU(nnx.Module):

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, f = cfg.d_model, cfg.d_ff
    self.cfg = cfg
    self.ops = ops_lib.backend(cfg)
    kernel = dict(param_dtype=cfg.param_dtype, cast_to_compute=True)  # Used via ops.dense.
    self.wi_gate = param(rngs, fan_in_init(d), (d, f), ("embed", "mlp"), **kernel)
    self.wi_up = param(rngs, fan_in_init(d), (d, f), ("embed", "mlp"), **kernel)
    self.wo = param(rngs, fan_in_init(f), (f, d), ("mlp", "embed"), **kernel)

  def __call__(self, x_btd: jax.Array, valid_bt: jax.Array | None = None, *,
               rng: jax.Array | None = None) -> jax.Array:
    del valid_bt  # Which tokens are real matters to MoE routing only (t5like/models/moe.py).
    x = x_btd.astype(dtype(self.cfg.dtype))
    gate_btf = self.ops.dense(x, self.wi_gate[...])  # btd,df->btf
    up_btf = self.ops.dense(x, self.wi_up[...])
    h_btf = constrain(jax.nn.silu(gate_btf) * up_btf, ("batch", "length", "mlp"))
    h_btf = dropout(h_btf, self.cfg.dropout_rate, fold(rng, 0))
    return self.ops.dense(h_btf, self.wo[...])  # btf,fd->btd
