"""Tied token embedding: one [vocab, embed] table is the input embedding(s) and the output layer."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from t5like import ops as ops_lib
from t5like.config.model import ModelConfig
from t5like.models.layers import constrain, dtype, param


class TiedEmbedding(nnx.Module):
  """T5's tied convention: table ~ N(0, 1); logits = (x / sqrt(d)) @ table^T, in float32."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.ops = ops_lib.backend(cfg)
    self.table = param(rngs, nnx.initializers.normal(stddev=1.0), (cfg.vocab_size, cfg.d_model),
                       ("vocab", "embed"), cfg.param_dtype)

  def embed(self, tokens_bt: jax.Array) -> jax.Array:
    x_btd = jnp.take(self.table[...], tokens_bt, axis=0).astype(dtype(self.cfg.dtype))
    return constrain(x_btd, ("batch", "length", "embed"))

  def logits(self, x_btd: jax.Array) -> jax.Array:
    """[..., vocab] float32 logits: btd,vd->btv."""
    dt = dtype(self.cfg.dtype)
    x_btd = (x_btd * (self.cfg.d_model ** -0.5)).astype(dt)
    logits_btv = self.ops.logits(x_btd, self.table[...].astype(dt))
    return constrain(logits_btv, ("batch", "length", "vocab"))
