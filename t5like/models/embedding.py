"""Tied token embedding: one [vocab, embed] table is the input embedding(s) and the output layer."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from t5like.config.model import ModelConfig
from t5like.models.layers import (TransposedKernel, constrain, dtype, few_row_matmul,
                                  matmul_2d, param)


class TiedEmbedding(nnx.Module):
  """T5's tied convention: table ~ N(0, 1); logits = (x / sqrt(d)) @ table^T, in float32."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.table = param(rngs, nnx.initializers.normal(stddev=1.0), (cfg.vocab_size, cfg.d_model),
                       ("vocab", "embed"), cfg.param_dtype)

  def embed(self, tokens_bt: jax.Array) -> jax.Array:
    x_btd = jnp.take(self.table[...], tokens_bt, axis=0).astype(dtype(self.cfg.dtype))
    return constrain(x_btd, ("batch", "length", "embed"))

  def logits(self, x_btd: jax.Array, table: TransposedKernel | None = None) -> jax.Array:
    """[..., vocab] float32 logits; ``table``: the decode step's copy of the table
    (``decode_table``), else the parameter."""
    dt = dtype(self.cfg.dtype)
    x = (x_btd * (self.cfg.d_model ** -0.5)).astype(dt)
    x_md = x.reshape(-1, x.shape[-1])
    if table is not None:
      logits_mv = few_row_matmul(x_md, table.astype(dt).w_nk, jnp.float32)
    else:  # btd,vd->btv as one 2-D matmul (see ``layers.project``).
      logits_mv = matmul_2d(x_md, self.table[...].astype(dt), 1, jnp.float32)
    logits_btv = logits_mv.reshape(*x.shape[:-1], -1)
    return constrain(logits_btv, ("batch", "length", "vocab"))

  def decode_table(self) -> TransposedKernel:
    """The table as the TransposedKernel of ``embed -> vocab`` (already ``[vocab, embed]``, no
    copy), for ``logits`` in the decode step (``layers.few_row_matmul``)."""
    table_vd = self.table.get_value()
    return TransposedKernel(table_vd, table_vd.shape[::-1], 1)
