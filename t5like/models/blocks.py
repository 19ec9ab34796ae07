"""Transformer layers: the self-attention block (DecLLM layer, RedLLM encoder layer) and the
RedLLM decoder block (self-attention, cross-attention, MLP). Pre-norm residual throughout."""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from t5like import ops as ops_lib
from t5like.config.model import ModelConfig
from t5like.models.attention import Attention, KVCache
from t5like.models.layers import constrain, dropout, fold
from t5like.models.masks import MaskSpec
from t5like.models.mlp import SwiGLU
from t5like.models.moe import MoEFeedForward
from t5like.models.norms import RMSNorm
from t5like.models.rotary import Rotary


class SelfContext(NamedTuple):
  """Per-call inputs every layer of a stack shares (closed over by the layer scan)."""
  rope_bt: Rotary  # sin / cos of the [batch, length] RoPE positions, computed once per call.
  mask_fwd: jax.Array | MaskSpec  # [batch, heads|1, length, length] mask of forward (or all)
  #   layers; a MaskSpec for the fused kernels (splash / cudnn).
  mask_bwd: jax.Array | None  # Mask of backward layers (mixed_attention="per_layer"), else None.
  causal: bool = False  # The masks allow no key after its query (the core skips those blocks).
  cache_index: jax.Array | int = 0  # With a KV cache: the slot of this call's first token (the
  #   masks are then over the cache's slots, unless ``prefill``).
  prefill: bool = False  # With a KV cache: this call's tokens are its first; the masks are the
  #   training ones over these tokens, attended by the training core (generation's prefill).
  valid_bt: jax.Array | None = None  # [batch, length] real (non-padding) tokens, for MoE loads.


class CrossContext(NamedTuple):
  """What the RedLLM decoder layers see of the encoder."""
  encoded_bsd: jax.Array | None  # [batch, enc_length, embed] final encoder states; None: the
  #   cross-attention keys/values are in the layer's cache already (generation).
  enc_rope_bs: Rotary  # sin / cos of the [batch, enc_length] encoder positions (RoPE keys).
  mask_bhts: jax.Array | MaskSpec  # [batch, 1, dec_length, enc_length] same-segment cross mask.


def layer_mask(ctx: SelfContext, layer_idx: jax.Array) -> jax.Array | MaskSpec:
  if isinstance(ctx.mask_fwd, MaskSpec):
    return ctx.mask_fwd._replace(backward=layer_idx % 2 == 1)
  if ctx.mask_bwd is None:
    return ctx.mask_fwd
  return jnp.where(layer_idx % 2 == 1, ctx.mask_bwd, ctx.mask_fwd)


def _mlp(cfg: ModelConfig, moe: bool, rngs: nnx.Rngs) -> SwiGLU | MoEFeedForward:
  return MoEFeedForward(cfg, rngs=rngs) if moe else SwiGLU(cfg, rngs=rngs)


def _norm(cfg: ModelConfig, rngs: nnx.Rngs) -> RMSNorm:
  return RMSNorm((cfg.d_model,), ("embed",), eps=cfg.norm_eps, param_dtype=cfg.param_dtype,
                 ops=ops_lib.backend(cfg), rngs=rngs)


class SelfAttentionBlock(nnx.Module):
  """x + Attn(Norm(x)); x + MLP(Norm(x)) (a mixture of experts when ``moe``). ``cache``: the
  self-attention's ``KVCache``."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, moe: bool = False):
    self.rate = cfg.dropout_rate
    self.pre_attention_norm = _norm(cfg, rngs)
    self.attention = Attention(cfg, rngs=rngs)
    self.pre_mlp_norm = _norm(cfg, rngs)
    self.mlp = _mlp(cfg, moe, rngs)

  def __call__(self, x_btd: jax.Array, ctx: SelfContext, layer_idx: jax.Array,
               rng: jax.Array | None, cross: CrossContext | None = None,
               cache: KVCache | None = None) -> tuple[jax.Array, KVCache | None]:
    del cross
    h = self.pre_attention_norm(x_btd)
    h, cache = self.attention(h, h, ctx.rope_bt, ctx.rope_bt, layer_mask(ctx, layer_idx),
                              causal=ctx.causal, rng=fold(rng, 1), cache=cache,
                              cache_index=ctx.cache_index, prefill=ctx.prefill)
    x_btd = x_btd + dropout(h, self.rate, fold(rng, 2))
    h = self.mlp(self.pre_mlp_norm(x_btd), ctx.valid_bt, rng=fold(rng, 3))
    x_btd = x_btd + dropout(h, self.rate, fold(rng, 4))
    return constrain(x_btd, ("batch", "length", "embed")), cache


class EncoderDecoderBlock(nnx.Module):
  """RedLLM decoder layer: causal self-attention, cross-attention to the encoder, MLP.
  ``cache``: (self-attention ``KVCache``, cross-attention ``KVCache``)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, moe: bool = False):
    self.rate = cfg.dropout_rate
    self.pre_self_attention_norm = _norm(cfg, rngs)
    self.self_attention = Attention(cfg, rngs=rngs)
    self.pre_cross_attention_norm = _norm(cfg, rngs)
    self.cross_attention = Attention(cfg, use_rope=cfg.cross_attention_rope, rngs=rngs)
    self.pre_mlp_norm = _norm(cfg, rngs)
    self.mlp = _mlp(cfg, moe, rngs)

  def __call__(self, x_btd: jax.Array, ctx: SelfContext, layer_idx: jax.Array,
               rng: jax.Array | None, cross: CrossContext | None = None,
               cache: tuple[KVCache, KVCache] | None = None
               ) -> tuple[jax.Array, tuple[KVCache, KVCache] | None]:
    assert cross is not None, "the decoder block needs the encoder outputs"
    self_cache, cross_cache = (None, None) if cache is None else cache
    h = self.pre_self_attention_norm(x_btd)
    h, self_cache = self.self_attention(h, h, ctx.rope_bt, ctx.rope_bt,
                                        layer_mask(ctx, layer_idx), causal=ctx.causal,
                                        rng=fold(rng, 1), cache=self_cache,
                                        cache_index=ctx.cache_index, prefill=ctx.prefill)
    x_btd = x_btd + dropout(h, self.rate, fold(rng, 2))
    h = self.pre_cross_attention_norm(x_btd)
    h, cross_cache = self.cross_attention(h, cross.encoded_bsd, ctx.rope_bt, cross.enc_rope_bs,
                                          cross.mask_bhts, rng=fold(rng, 3), cache=cross_cache)
    x_btd = x_btd + dropout(h, self.rate, fold(rng, 4))
    h = self.mlp(self.pre_mlp_norm(x_btd), ctx.valid_bt, rng=fold(rng, 5))
    x_btd = x_btd + dropout(h, self.rate, fold(rng, 6))
    cache = None if cache is None else (self_cache, cross_cache)
    return constrain(x_btd, ("batch", "length", "embed")), cache
