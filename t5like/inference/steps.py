"""Prefill and one-token decode steps over a KV cache, for DecLLM and RedLLM.

Every layer runs the training code's own pieces (``Attention.project_qkv``, the module-level
``dot_product_attention``, ``Attention.project_out``, the block's norms and MLP) on the same
parameters; only where keys/values come from differs. Dropout is off (inference), so the residual
wiring below is the blocks' ``__call__`` without it. Masks are the training masks: prefill builds
them with ``self_context`` (causal, prefix, mixed forward/backward), padded with ``False`` over
the not-yet-written cache slots; a decode token is causal, so it sees exactly the valid slots
(mixed attention only changes bidirectional pairs, which a generated token is never part of).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from t5like.inference.cache import KVCache, init_cache, mark_valid, read_layer, write_layer
from t5like.models.attention import dot_product_attention
from t5like.models.blocks import SelfContext, layer_mask
from t5like.models.decllm import self_context
from t5like.models.layers import constrain
from t5like.models.stack import LayerStack


class CrossCache(NamedTuple):
  """What RedLLM's decoder needs of the encoder, computed once per prompt."""
  k_lbsgk: jax.Array  # [dec_layers, batch, enc_len, kv_heads, head_dim] rotated cross keys.
  v_lbsgk: jax.Array  # [dec_layers, batch, enc_len, kv_heads, head_dim] cross values.
  mask_b11s: jax.Array  # bool [batch, 1, 1, enc_len]: non-padding encoder tokens.
  enc_len_b: jax.Array  # [batch] encoder (prompt) length of each row.


def run_layers(stack: LayerStack, body: Callable, carry: Any, xs: Any = None):
  """``body(carry, layer, i, xs_i) -> (carry, y)`` over the stack, scanned or unrolled as in
  training (same stacked parameters either way); returns (carry, ys stacked on a layer axis)."""
  graphdef, params = nnx.split(stack.layers)

  def step(c, inp):
    p, i, x = inp
    return body(c, nnx.merge(graphdef, p), i, x)

  idx = jnp.arange(stack.num_layers)
  if stack.scan:
    return jax.lax.scan(step, carry, (params, idx, xs))
  ys = []
  for i in range(stack.num_layers):
    carry, y = step(carry, jax.tree.map(lambda a, i=i: a[i], (params, idx, xs)))
    ys.append(y)
  return carry, jax.tree.map(lambda *a: jnp.stack(a), *ys)


def _cached_attention(attn, h_btd, pos_bt, cache: KVCache, i, slot, mask_bhts):
  """Self-attention of new tokens [batch, t] written at ``slot``, over every cached slot."""
  q_bthk, k_btgk, v_btgk = attn.project_qkv(h_btd, h_btd, pos_bt, pos_bt)
  cache = cache._replace(k_lbsgk=write_layer(cache.k_lbsgk, i, slot, k_btgk),
                         v_lbsgk=write_layer(cache.v_lbsgk, i, slot, v_btgk))
  out_bthk = dot_product_attention(q_bthk, read_layer(cache.k_lbsgk, i),
                                   read_layer(cache.v_lbsgk, i), mask_bhts)
  return attn.project_out(out_bthk), cache


def _self_block(block, x_btd, pos_bt, cache, i, slot, mask_bhts):
  """SelfAttentionBlock.__call__ with the cache (x + Attn(Norm(x)); x + MLP(Norm(x)))."""
  h, cache = _cached_attention(block.attention, block.pre_attention_norm(x_btd), pos_bt, cache,
                               i, slot, mask_bhts)
  x_btd = x_btd + h
  x_btd = x_btd + block.mlp(block.pre_mlp_norm(x_btd))
  return constrain(x_btd, ("batch", "length", "embed")), cache


def _pad_keys(mask_bhts: jax.Array | None, slots: int) -> jax.Array | None:
  if mask_bhts is None:
    return None
  return jnp.pad(mask_bhts, ((0, 0), (0, 0), (0, 0), (0, slots - mask_bhts.shape[-1])))


def _logits(model, norm, x_btd) -> jax.Array:
  return model.embedding.logits(norm(x_btd))[:, -1]  # [batch, vocab] float32.


def decllm_prefill(model, tokens_bp, segment_ids_bp, positions_bp, slots: int):
  """Runs the (left-padded) prompt through DecLLM into a cache of ``slots`` slots.

  Masks as in training: causal, or for ``decoder_attention="prefix"`` bidirectional over the
  whole prompt (``decoder_causal_attention`` = the prompt, BOS included), mixed if configured.
  Returns (logits [batch, vocab] of the last prompt token, cache).
  """
  cfg = model.cfg
  prefix_bp = segment_ids_bp if cfg.decoder_attention == "prefix" else None
  ctx = self_context(cfg, segment_ids_bp, positions_bp, cfg.decoder_attention, prefix_bp)
  ctx = SelfContext(positions_bp, _pad_keys(ctx.mask_fwd, slots), _pad_keys(ctx.mask_bwd, slots))
  cache = init_cache(cfg, cfg.num_layers, tokens_bp.shape[0], slots)
  cache = cache._replace(valid_bs=mark_valid(cache.valid_bs, 0, segment_ids_bp > 0))

  def body(carry, layer, i, _):
    x, c = carry
    return _self_block(layer, x, positions_bp, c, i, 0, layer_mask(ctx, i)), None

  (x_bpd, cache), _ = run_layers(model.decoder, body, (model.embedding.embed(tokens_bp), cache))
  return _logits(model, model.final_norm, x_bpd), cache


def decllm_decode(model, token_b, position_b, slot, cache: KVCache):
  """One token per row at cache ``slot``; returns (logits [batch, vocab], cache)."""
  valid_bs = mark_valid(cache.valid_bs, slot, jnp.ones_like(token_b, bool)[:, None])
  cache = cache._replace(valid_bs=valid_bs)
  mask_b11s = valid_bs[:, None, None, :]

  def body(carry, layer, i, _):
    x, c = carry
    return _self_block(layer, x, position_b[:, None], c, i, slot, mask_b11s), None

  x_b1d = model.embedding.embed(token_b[:, None])
  (x_b1d, cache), _ = run_layers(model.decoder, body, (x_b1d, cache))
  return _logits(model, model.final_norm, x_b1d), cache


def redllm_prefill(model, enc_tokens_bs, slots: int) -> tuple[CrossCache, KVCache]:
  """Encodes the right-padded prompt (``RedLLM.encode``, exactly the training path) and caches
  the cross-attention keys/values of every decoder layer; an empty decoder cache of ``slots``."""
  cfg = model.cfg
  enc = model.encode({"encoder_input_tokens": enc_tokens_bs})

  def body(carry, layer, i, _):
    del i
    _, k, v = layer.cross_attention.project_qkv(enc.encoded_bsd, enc.encoded_bsd,
                                                enc.positions_bs, enc.positions_bs)
    return carry, (k, v)

  _, (k_lbsgk, v_lbsgk) = run_layers(model.decoder, body, None)
  seg_bs = enc.segment_ids_bs > 0
  cross = CrossCache(k_lbsgk, v_lbsgk, seg_bs[:, None, None, :],
                     jnp.sum(seg_bs, axis=1).astype(jnp.int32))
  return cross, init_cache(cfg, cfg.num_decoder_layers, enc_tokens_bs.shape[0], slots)


def redllm_decode(model, token_b, position_b, slot, cache: KVCache, cross: CrossCache):
  """One decoder token per row (causal self-attention over the cache, cross-attention to the
  cached encoder keys with RoPE as in training); returns (logits [batch, vocab], cache)."""
  valid_bs = mark_valid(cache.valid_bs, slot, jnp.ones_like(token_b, bool)[:, None])
  cache = cache._replace(valid_bs=valid_bs)
  mask_b11s = valid_bs[:, None, None, :]
  pos_b1 = position_b[:, None]

  def body(carry, layer, i, kv):
    x, c = carry
    h, c = _cached_attention(layer.self_attention, layer.pre_self_attention_norm(x), pos_b1, c,
                             i, slot, mask_b11s)
    x = x + h
    h = layer.pre_cross_attention_norm(x)
    q_b1hk, _, _ = layer.cross_attention.project_qkv(h, h, pos_b1, pos_b1)  # k, v unused.
    x = x + layer.cross_attention.project_out(
        dot_product_attention(q_b1hk, kv[0], kv[1], cross.mask_b11s))
    x = x + layer.mlp(layer.pre_mlp_norm(x))
    return (constrain(x, ("batch", "length", "embed")), c), None

  x_b1d = model.embedding.embed(token_b[:, None])
  (x_b1d, cache), _ = run_layers(model.decoder, body, (x_b1d, cache),
                                 (cross.k_lbsgk, cross.v_lbsgk))
  return _logits(model, model.decoder_norm, x_b1d), cache
