"""Prefill and one-token decode steps: the model's own forward over a per-layer KV cache.

Both run the training code itself (``DecLLM.hidden`` / ``RedLLM.decoder_hidden``: the same
blocks, attention and MLP, and ``head``), handing every attention layer its ``KVCache`` and
``SelfContext.cache_index``: the layer writes the keys and values of its new tokens there and
its queries attend over the cache's slots, under masks built here over those slots. Dropout is
off (no rng).

- **Prefill** (DecLLM) is the training forward over the left-padded prompt: the training masks
  (causal, prefix, mixed forward/backward) over the prompt's own keys, through the attention
  core training uses (``model.attention_impl``: splash on TPU, the reference core on CPU; cuDNN
  takes no left-padded rows, so a cuDNN model prefills on the reference core); it writes slots
  ``0 .. P-1``. RedLLM's prefill is
  ``RedLLM.encode`` (exactly the training path) and the decoder's first step from BOS, which also
  writes each layer's cross-attention keys and values (computed once per prompt; later steps
  attend over them as they are).
- **Decode** feeds one token per row at the same ``slot`` in every row, attending over the cache
  with the reference core. A generated token is causal, so it sees exactly the valid cache slots
  (mixed attention only changes bidirectional pairs, which a generated token is never part of).

The decoder's layers run unstacked (``LayerStack.unstacked``, made once per ``Generator``):
slicing the stacked ``[layers, ...]`` weights inside every step would copy them once per token.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from t5like import ops
from t5like.models.attention import KVCache
from t5like.models.blocks import CrossContext, SelfContext
from t5like.models.decllm import self_context
from t5like.models.layers import COMPUTE_CAST, dtype
from t5like.models.moe import route_dropless
from t5like.models.rotary import rotary_table


class DecodeState(NamedTuple):
  """What a decode step carries from one token to the next."""
  layers: tuple  # Per decoder layer its cache: DecLLM a KVCache, RedLLM (self, cross) KVCaches.
  valid_bs: jax.Array  # bool [batch, slots]: self-attention slots written and not padding.
  cross: CrossContext | None = None  # RedLLM: the encoder's rotation and mask (no states).


def decode_layout(model) -> nnx.Module:
  """A copy of ``model`` whose decoder layers are unstacked and whose parameters that every use
  casts to the compute dtype (``layers.COMPUTE_CAST``: dense kernels, embedding tables) are held
  in it: a bf16 model's decode step then reads them at 2 bytes, not 4, and casts nothing
  (converting them every token was ~40 % of a 1B model's decode step on a GPU). The tokens and
  logits are those of the stored weights: every use casts them the same way. MoE layers route
  dropless (``moe.route_dropless``): no routed token is ever dropped at generation."""
  graphdef, state = nnx.split(model)
  dt = dtype(model.cfg.dtype)

  def held(v: nnx.Variable) -> nnx.Variable:
    x = v.get_value()
    if (v.get_metadata().get(COMPUTE_CAST) and jnp.issubdtype(x.dtype, jnp.floating)
        and x.dtype != dt):
      return v.replace(x.astype(dt))
    return v

  state = jax.tree.map(held, state, is_leaf=lambda x: isinstance(x, nnx.Variable))
  copy = route_dropless(nnx.merge(graphdef, state))
  copy.decoder = copy.decoder.unstacked()
  return copy


def _empty(cfg, batch: int, slots: int) -> KVCache:
  zeros = jnp.zeros((batch, slots, cfg.kv_heads, cfg.head_dim), dtype(cfg.dtype))
  return KVCache(zeros, zeros)


def mark_valid(valid_bs: jax.Array, slot: jax.Array | int) -> jax.Array:
  """``valid`` with ``slot`` set in every row (the token just written)."""
  return jax.lax.dynamic_update_slice(valid_bs, jnp.ones((valid_bs.shape[0], 1), bool),
                                      (jnp.zeros((), jnp.int32), jnp.asarray(slot, jnp.int32)))


def _step_context(cfg, position_b: jax.Array, valid_bs: jax.Array, slot,
                  live_b: jax.Array | None) -> SelfContext:
  """``live_b``: rows still generating (finished and filler rows are not counted as tokens)."""
  rope_b1 = rotary_table(ops.backend(cfg), position_b[:, None], cfg.head_dim,
                         cfg.rope_max_wavelength)
  return SelfContext(rope_b1, valid_bs[:, None, None, :], None, cache_index=slot,
                     valid_bt=None if live_b is None else live_b[:, None])


def decllm_prefill(model, tokens_bp, segment_ids_bp, positions_bp, slots: int):
  """Runs the (left-padded) prompt through DecLLM into a cache of ``slots`` slots.

  Masks and attention core as in training: causal, or for ``decoder_attention="prefix"``
  bidirectional over the whole prompt (``decoder_causal_attention`` = the prompt, BOS included),
  mixed if configured. Returns (logits [batch, vocab] of the last prompt token, DecodeState).
  """
  cfg = model.cfg
  b, p = tokens_bp.shape
  prefix_bp = segment_ids_bp if cfg.decoder_attention == "prefix" else None
  # The rows are left-padded: a fused core that cannot attend those (cuDNN) leaves the prefill
  # to the reference core.
  serves = ops.serves_leading_padding(cfg)
  ctx = self_context(cfg, segment_ids_bp, positions_bp, cfg.decoder_attention, prefix_bp,
                     materialize=not serves)
  ctx = ctx._replace(cache_index=0, prefill=True)
  cache = tuple(_empty(cfg, b, slots) for _ in range(cfg.num_layers))
  x_bpd, cache = model.hidden(tokens_bp, ctx, cache=cache)
  valid_bs = jnp.pad(segment_ids_bp > 0, ((0, 0), (0, slots - p)))
  return model.head(x_bpd[:, -1:])[:, 0], DecodeState(cache, valid_bs)


def decllm_decode(model, token_b, position_b, slot, state: DecodeState, live_b=None):
  """One token per row at cache ``slot`` (``live_b``: rows still generating, default all);
  returns (logits [batch, vocab], state)."""
  valid_bs = mark_valid(state.valid_bs, slot)
  ctx = _step_context(model.cfg, position_b, valid_bs, slot, live_b)
  x_b1d, cache = model.hidden(token_b[:, None], ctx, cache=state.layers)
  return model.head(x_b1d)[:, 0], DecodeState(cache, valid_bs)


def redllm_prefill(model, enc_tokens_bs, pos0_b, slots: int):
  """Encodes the right-padded prompt and runs the decoder's first step (BOS at ``pos0``), which
  writes every layer's cross-attention keys/values. Returns (logits [batch, vocab], state)."""
  cfg = model.cfg
  b, s = enc_tokens_bs.shape
  enc = model.encode({"encoder_input_tokens": enc_tokens_bs})
  cross = model.cross_context(enc, (enc.segment_ids_bs > 0)[:, None, None, :])
  layers = tuple((_empty(cfg, b, slots), _empty(cfg, b, s)) for _ in range(cfg.num_decoder_layers))
  state = DecodeState(layers, jnp.zeros((b, slots), bool), cross)
  logits_bv, state = redllm_decode(model, jnp.zeros((b,), jnp.int32), pos0_b, 0, state)
  return logits_bv, state._replace(cross=cross._replace(encoded_bsd=None))


def redllm_decode(model, token_b, position_b, slot, state: DecodeState, live_b=None):
  """One decoder token per row (causal self-attention over the cache, cross-attention to the
  encoder with RoPE as in training; ``live_b`` as in ``decllm_decode``); returns (logits
  [batch, vocab], state)."""
  valid_bs = mark_valid(state.valid_bs, slot)
  ctx = _step_context(model.cfg, position_b, valid_bs, slot, live_b)
  x_b1d, layers = model.decoder_hidden(token_b[:, None], ctx, state.cross, cache=state.layers)
  return model.head(x_b1d)[:, 0], DecodeState(layers, valid_bs, state.cross)
