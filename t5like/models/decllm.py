"""DecLLM: the decoder-only baseline (docs/paper.md §1), causal or with a bidirectional prefix.

Input: the arrays of one seqio Decoder/PrefixLM batch —
``decoder_input_tokens`` [batch, length], optional ``decoder_segment_ids`` (packing; default one
segment), ``decoder_positions`` (default 0..length-1) and, for ``decoder_attention="prefix"``,
``decoder_causal_attention`` (1 on the bidirectional prefix). Output: float32 logits
[batch, length, vocab] from the tied embedding.
"""
from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp
from flax import nnx

from t5like import ops as ops_lib
from t5like.config.model import ModelConfig
from t5like.config.moe import stack_moe_flags
from t5like.models import masks
from t5like.models.attention import KVCache
from t5like.models.blocks import SelfAttentionBlock, SelfContext
from t5like.models.embedding import TiedEmbedding
from t5like.models.layers import dropout, fold
from t5like.models.norms import RMSNorm
from t5like.models.rotary import rotary_table
from t5like.models.stack import build_stack


def self_context(cfg: ModelConfig, segment_ids_bt: jax.Array, positions_bt: jax.Array, kind: str,
                 prefix_bt: jax.Array | None = None, *, materialize: bool = False,
                 valid_bt: jax.Array | None = None) -> SelfContext:
  """Builds the masks a self-attention stack needs (both directions for per-layer mixing), or
  their ``MaskSpec`` for the fused kernels unless ``materialize`` (KV cache, attention maps).
  ``valid_bt`` marks the real tokens (default: segment id > 0), whose MoE loads are counted."""
  mixed = cfg.mixed_attention if kind != "causal" else "none"
  spec = masks.MaskSpec(segment_ids_bt, segment_ids_bt, kind, prefix_bt, mixed, cfg.num_heads)
  rope_bt = rotary_table(ops_lib.backend(cfg), positions_bt, cfg.head_dim,
                         cfg.rope_max_wavelength)
  valid_bt = segment_ids_bt > 0 if valid_bt is None else valid_bt
  if ops_lib.backend(cfg).fused and not materialize:
    return SelfContext(rope_bt, spec, None, valid_bt=valid_bt)
  bwd = masks.materialize(spec._replace(backward=True)) if mixed == "per_layer" else None
  return SelfContext(rope_bt, masks.materialize(spec), bwd, causal=kind == "causal",
                     valid_bt=valid_bt)


def real_tokens(batch: Mapping[str, jax.Array], segments: str, targets: str) -> jax.Array | None:
  """Non-padding tokens: segment id > 0 when packed, else (unpacked rows) target > 0."""
  if batch.get(segments) is not None:
    return batch[segments] > 0
  return batch[targets] > 0 if batch.get(targets) is not None else None


def default_positions(tokens_bt: jax.Array) -> jax.Array:
  return jnp.broadcast_to(jnp.arange(tokens_bt.shape[1], dtype=jnp.int32), tokens_bt.shape)


class DecLLM(nnx.Module):

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    cfg = ops_lib.resolve(cfg.validate())
    self.cfg = cfg
    self.embedding = TiedEmbedding(cfg, rngs=rngs)
    self.decoder = build_stack(lambda r, moe: SelfAttentionBlock(cfg, rngs=r, moe=moe),
                               stack_moe_flags(cfg.moe, "decoder", cfg.num_layers), cfg, rngs=rngs)
    self.final_norm = RMSNorm((cfg.d_model,), ("embed",), eps=cfg.norm_eps,
                              param_dtype=cfg.param_dtype, ops=ops_lib.backend(cfg), rngs=rngs)

  def __call__(self, batch: Mapping[str, jax.Array], *,
               dropout_rng: jax.Array | None = None) -> jax.Array:
    """Logits [batch, length, vocab]; dropout is applied only when ``dropout_rng`` is given."""
    cfg = self.cfg
    tokens_bt = batch["decoder_input_tokens"]
    segment_ids_bt = batch.get("decoder_segment_ids")
    if segment_ids_bt is None:
      segment_ids_bt = jnp.ones_like(tokens_bt)
    positions_bt = batch.get("decoder_positions")
    if positions_bt is None:
      positions_bt = default_positions(tokens_bt)
    prefix_bt = batch.get("decoder_causal_attention") if cfg.decoder_attention == "prefix" else None
    if cfg.decoder_attention == "prefix" and prefix_bt is None:
      raise ValueError("model.decoder_attention='prefix' needs the `decoder_causal_attention` "
                       "feature (use seqio's PrefixLMFeatureConverter)")
    ctx = self_context(cfg, segment_ids_bt, positions_bt, cfg.decoder_attention, prefix_bt,
                       valid_bt=real_tokens(batch, "decoder_segment_ids", "decoder_target_tokens"))
    x_btd, _ = self.hidden(tokens_bt, ctx, dropout_rng=dropout_rng)
    return self.head(x_btd, dropout_rng=dropout_rng)

  def hidden(self, tokens_bt: jax.Array, ctx: SelfContext, *,
             dropout_rng: jax.Array | None = None, cache: tuple[KVCache, ...] | None = None
             ) -> tuple[jax.Array, tuple[KVCache, ...] | None]:
    """The decoder stack's output [batch, length, embed] (and the updated per-layer cache)."""
    x_btd = dropout(self.embedding.embed(tokens_bt), self.cfg.dropout_rate, fold(dropout_rng, 0))
    return self.decoder(x_btd, ctx, rng=fold(dropout_rng, 1), cache=cache)

  def head(self, x_btd: jax.Array, *, dropout_rng: jax.Array | None = None) -> jax.Array:
    """Final norm and tied output layer: float32 logits [batch, length, vocab]."""
    x_btd = dropout(self.final_norm(x_btd), self.cfg.dropout_rate, fold(dropout_rng, 2))
    return self.embedding.logits(x_btd)
