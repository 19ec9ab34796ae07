"""RedLLM: the revisited encoder-decoder (docs/paper.md §1).

Bidirectional encoder + decoder with causal self-attention and cross-attention; RoPE in all three
with continuous positions (decoder position = that example's encoder length + t; queries rotated
by decoder positions, keys by encoder positions); extra norm on the attention output; one tied
embedding for encoder input, decoder input and output.

``model.shared_encoder_decoder`` (T5's "encoder-decoder, shared" row): decoder layer i runs with
encoder layer i's self-attention, MLP and pre-norms (one copy of those arrays, whose gradients
sum both uses) and only its cross-attention and that pre-norm of its own (`CrossBlock`).

Input: one seqio EncDec batch — ``encoder_input_tokens``, ``encoder_segment_ids``,
``encoder_positions``, ``decoder_input_tokens``, ``decoder_segment_ids``, ``decoder_positions``.
With packing, ``decoder_positions`` must already be continuous (``t5like.data`` offsets them per
packed segment). Without segment/position arrays (one unpacked example per row) they default to
encoder segment = non-padding tokens, encoder positions 0..k-1 and decoder positions k..k+m-1.
"""
from __future__ import annotations

from typing import Mapping, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from t5like import ops as ops_lib
from t5like.config.model import ModelConfig
from t5like.config.moe import stack_moe_flags
from t5like.models import masks
from t5like.models.attention import Attention, KVCache
from t5like.models.blocks import (CrossContext, EncoderDecoderBlock, SelfAttentionBlock,
                                  SelfContext, layer_mask)
from t5like.models.decllm import default_positions, real_tokens, self_context
from t5like.models.embedding import TiedEmbedding
from t5like.models.layers import constrain, dropout, fold
from t5like.models.norms import RMSNorm
from t5like.models.rotary import rotary_table
from t5like.models.stack import LayerStack, build_stack, remat_policy


class Encoded(NamedTuple):
  encoded_bsd: jax.Array  # [batch, enc_length, embed] normalised encoder output.
  positions_bs: jax.Array  # [batch, enc_length] encoder positions.
  segment_ids_bs: jax.Array  # [batch, enc_length] encoder segment ids (0 = padding).


class CrossBlock(nnx.Module):
  """A shared-parameter decoder layer's own weights: cross-attention and its pre-norm."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.rate = cfg.dropout_rate
    self.pre_cross_attention_norm = RMSNorm((cfg.d_model,), ("embed",), eps=cfg.norm_eps,
                                            param_dtype=cfg.param_dtype,
                                            ops=ops_lib.backend(cfg), rngs=rngs)
    self.cross_attention = Attention(cfg, use_rope=cfg.cross_attention_rope, rngs=rngs)


def shared_decoder_layer(enc: SelfAttentionBlock, own: CrossBlock, x_btd: jax.Array, ctx,
                         layer_idx: jax.Array, rng: jax.Array | None,
                         cross: CrossContext) -> jax.Array:
  """`EncoderDecoderBlock` with the self-attention, MLP and their norms taken from ``enc``."""
  h = enc.pre_attention_norm(x_btd)
  h, _ = enc.attention(h, h, ctx.rope_bt, ctx.rope_bt, layer_mask(ctx, layer_idx),
                       causal=ctx.causal, rng=fold(rng, 1))
  x_btd = x_btd + dropout(h, own.rate, fold(rng, 2))
  h = own.pre_cross_attention_norm(x_btd)
  h, _ = own.cross_attention(h, cross.encoded_bsd, ctx.rope_bt, cross.enc_rope_bs,
                             cross.mask_bhts, rng=fold(rng, 3))
  x_btd = x_btd + dropout(h, own.rate, fold(rng, 4))
  h = enc.mlp(enc.pre_mlp_norm(x_btd), rng=fold(rng, 5))
  x_btd = x_btd + dropout(h, own.rate, fold(rng, 6))
  return constrain(x_btd, ("batch", "length", "embed"))


class RedLLM(nnx.Module):

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    cfg = ops_lib.resolve(cfg.validate())
    self.cfg = cfg
    norm = lambda: RMSNorm((cfg.d_model,), ("embed",), eps=cfg.norm_eps,  # noqa: E731
                           param_dtype=cfg.param_dtype, ops=ops_lib.backend(cfg), rngs=rngs)
    self.embedding = TiedEmbedding(cfg, rngs=rngs)
    enc = stack_moe_flags(cfg.moe, "encoder", cfg.num_encoder_layers)
    dec = stack_moe_flags(cfg.moe, "decoder", cfg.num_decoder_layers)
    self.encoder = build_stack(lambda r, moe: SelfAttentionBlock(cfg, rngs=r, moe=moe), enc, cfg,
                               rngs=rngs)
    self.encoder_norm = norm()
    if cfg.shared_encoder_decoder:  # Decoder layers: cross-attention only (no MoE with this).
      self.decoder = LayerStack(lambda r: CrossBlock(cfg, rngs=r), cfg.num_decoder_layers, cfg,
                                rngs=rngs)
    else:
      self.decoder = build_stack(lambda r, moe: EncoderDecoderBlock(cfg, rngs=r, moe=moe), dec,
                                 cfg, rngs=rngs)
    self.decoder_norm = norm()

  def encode(self, batch: Mapping[str, jax.Array], *,
             dropout_rng: jax.Array | None = None) -> Encoded:
    cfg = self.cfg
    tokens_bs = batch["encoder_input_tokens"]
    segment_ids_bs = batch.get("encoder_segment_ids")
    if segment_ids_bs is None:
      segment_ids_bs = (tokens_bs != 0).astype(jnp.int32)
    positions_bs = batch.get("encoder_positions")
    if positions_bs is None:
      positions_bs = default_positions(tokens_bs)
    ctx = self_context(cfg, segment_ids_bs, positions_bs, "bidirectional")
    x_bsd = dropout(self.embedding.embed(tokens_bs), cfg.dropout_rate, fold(dropout_rng, 0))
    x_bsd, _ = self.encoder(x_bsd, ctx, rng=fold(dropout_rng, 1))
    x_bsd = dropout(self.encoder_norm(x_bsd), cfg.dropout_rate, fold(dropout_rng, 2))
    return Encoded(x_bsd, positions_bs, segment_ids_bs)

  def decoder_positions(self, batch: Mapping[str, jax.Array], enc: Encoded) -> jax.Array:
    """Given positions, or (unpacked rows) k..k+m-1 with k the row's encoder length."""
    positions_bt = batch.get("decoder_positions")
    if positions_bt is not None:
      return positions_bt
    positions_bt = default_positions(batch["decoder_input_tokens"])
    if self.cfg.continuous_positions:
      enc_len_b = jnp.sum(enc.segment_ids_bs > 0, axis=1).astype(jnp.int32)
      positions_bt = positions_bt + enc_len_b[:, None]
    return positions_bt

  def decode(self, enc: Encoded, batch: Mapping[str, jax.Array], *,
             dropout_rng: jax.Array | None = None) -> jax.Array:
    """Decoder logits [batch, dec_length, vocab] given the encoder output."""
    cfg = self.cfg
    tokens_bt = batch["decoder_input_tokens"]
    segment_ids_bt = batch.get("decoder_segment_ids")
    if segment_ids_bt is None:
      segment_ids_bt = jnp.ones_like(tokens_bt)
    ctx = self_context(cfg, segment_ids_bt, self.decoder_positions(batch, enc), "causal",
                       valid_bt=real_tokens(batch, "decoder_segment_ids", "decoder_target_tokens"))
    spec = masks.MaskSpec(segment_ids_bt, enc.segment_ids_bs, "cross")
    cross = self.cross_context(enc, spec if ops_lib.backend(cfg).fused else
                               masks.materialize(spec))
    x_btd, _ = self.decoder_hidden(tokens_bt, ctx, cross, dropout_rng=dropout_rng)
    return self.head(x_btd, dropout_rng=dropout_rng)

  def cross_context(self, enc: Encoded, mask_bhts: jax.Array | masks.MaskSpec) -> CrossContext:
    cfg = self.cfg
    enc_rope_bs = rotary_table(ops_lib.backend(cfg), enc.positions_bs, cfg.head_dim,
                               cfg.rope_max_wavelength)
    return CrossContext(enc.encoded_bsd, enc_rope_bs, mask_bhts)

  def decoder_hidden(self, tokens_bt: jax.Array, ctx: SelfContext, cross: CrossContext, *,
                     dropout_rng: jax.Array | None = None,
                     cache: tuple[tuple[KVCache, KVCache], ...] | None = None):
    """The decoder stack's output [batch, dec_length, embed] (and the updated per-layer
    (self, cross) caches)."""
    x_btd = dropout(self.embedding.embed(tokens_bt), self.cfg.dropout_rate, fold(dropout_rng, 3))
    if self.cfg.shared_encoder_decoder:
      if cache is not None:
        raise ValueError("model.shared_encoder_decoder=True has no KV-cache decoding yet; score "
                         "it by loss (eval.py) or generate with an unshared RedLLM")
      return self._shared_decoder(x_btd, ctx, fold(dropout_rng, 4), cross), None
    return self.decoder(x_btd, ctx, rng=fold(dropout_rng, 4), cross=cross, cache=cache)

  def head(self, x_btd: jax.Array, *, dropout_rng: jax.Array | None = None) -> jax.Array:
    """Final decoder norm and tied output layer: float32 logits [batch, length, vocab]."""
    x_btd = dropout(self.decoder_norm(x_btd), self.cfg.dropout_rate, fold(dropout_rng, 5))
    return self.embedding.logits(x_btd)

  def _shared_decoder(self, x_btd: jax.Array, ctx, rng: jax.Array | None,
                      cross: CrossContext) -> jax.Array:
    """The decoder stack when it shares the encoder's layers (scanned or looped like
    `LayerStack`, over the encoder's and the decoder's own stacked arrays together)."""
    enc_def, enc_params = nnx.split(self.encoder.layers)
    own_def, own_params = nnx.split(self.decoder.layers)

    def body(x, xs):
      enc_p, own_p, i = xs
      return shared_decoder_layer(nnx.merge(enc_def, enc_p), nnx.merge(own_def, own_p), x, ctx,
                                  i, fold(rng, i), cross), None

    if self.cfg.remat_policy != "none":
      body = jax.checkpoint(body, policy=remat_policy(self.cfg.remat_policy),
                            prevent_cse=not self.cfg.scan_layers)
    idx = jnp.arange(self.cfg.num_decoder_layers)
    if self.cfg.scan_layers:
      return jax.lax.scan(body, x_btd, (enc_params, own_params, idx))[0]
    for i in range(self.cfg.num_decoder_layers):
      take = lambda t, i=i: jax.tree.map(lambda a: a[i], t)  # noqa: E731
      x_btd, _ = body(x_btd, (take(enc_params), take(own_params), idx[i]))
    return x_btd

  def __call__(self, batch: Mapping[str, jax.Array], *,
               dropout_rng: jax.Array | None = None) -> jax.Array:
    enc = self.encode(batch, dropout_rng=dropout_rng)
    return self.decode(enc, batch, dropout_rng=dropout_rng)
