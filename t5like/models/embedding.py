"""Tied token embedding: one [vocab, embed] table is the input embedding(s) and the output layer
(the paper); ``model.tie_embeddings=False`` adds a separate output table (imported Llama / Qwen3
checkpoints)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from t5like import ops as ops_lib
from t5like.config.model import ModelConfig
from t5like.models.layers import constrain, dtype, fan_in_init, param, ruled


class TiedEmbedding(nnx.Module):
  """T5's tied convention: table ~ N(0, 1); logits = (x / sqrt(d)) @ table^T, in float32.
  ``scale_logits=False`` drops the 1 / sqrt(d); ``tie_embeddings=False`` multiplies by
  ``output`` (its own [vocab, embed] table) instead of ``table``."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.ops = ops_lib.backend(cfg)
    self.table = param(rngs, nnx.initializers.normal(stddev=1.0), (cfg.vocab_size, cfg.d_model),
                       ("vocab", "embed"), cfg.param_dtype, cast_to_compute=True)
    if not cfg.tie_embeddings:
      self.output = param(rngs, fan_in_init(cfg.d_model), (cfg.vocab_size, cfg.d_model),
                          ("vocab", "embed"), cfg.param_dtype, cast_to_compute=True)

  def embed(self, tokens_bt: jax.Array) -> jax.Array:
    dt = dtype(self.cfg.dtype)
    table = self.table[...]
    if ruled("lookup"):  # The chips ask for the table gathered to each device (partitioning.py),
      table = constrain(table.astype(dt), ("vocab", "lookup"))  # in the compute dtype.
    return constrain(jnp.take(table, tokens_bt, axis=0).astype(dt), ("batch", "length", "embed"))

  def logits(self, x_btd: jax.Array) -> jax.Array:
    """[..., vocab] float32 logits: btd,vd->btv."""
    dt = dtype(self.cfg.dtype)
    if self.cfg.scale_logits:
      x_btd = x_btd * (self.cfg.d_model ** -0.5)
    table = self.table if self.cfg.tie_embeddings else self.output
    logits_btv = self.ops.logits(x_btd.astype(dt), table[...].astype(dt))
    return constrain(logits_btv, ("batch", "length", "vocab"))
