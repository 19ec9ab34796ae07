"""Prefill and one-token decode steps over a KV cache, for DecLLM and RedLLM.

Every layer runs the training code's own pieces (``Attention.project_qkv``, the module-level
``dot_product_attention``, ``Attention.project_out``, the block's norms and MLP) on the same
parameters; only where keys/values come from differs. Dropout is off (inference), so the residual
wiring below is the blocks' ``__call__`` without it.

- **Prefill** is the training forward over the prompt (layers scanned as in training, masks from
  ``self_context``: causal, prefix, mixed forward/backward), which also returns every layer's
  keys and values; they become the cache. DecLLM's last layer runs apart, its query, attention
  and MLP at the last position only: nothing reads its output elsewhere.
- **Decode** feeds one token per row. A generated token is causal, so it sees exactly the valid
  cache slots (mixed attention only changes bidirectional pairs, which a generated token is
  never part of). Its layers run unrolled over per-layer parameter copies made once per
  ``generate`` call (``decode_weights``): slicing the stacked ``[layers, ...]`` weights inside
  every step would copy all weights once per token, which on XLA:CPU doubles the step time. On
  CPU those copies hold the dense kernels transposed, and with the embedding table they are
  ``TransposedKernel``s: ``[out, in]``, the streamed operand of the few-row products
  (``layers.few_row_matmul``), which XLA:CPU runs fastest; kernels that read the same input
  (q | k | v, gate | up) are stored side by side and read by one product (``InputKernels``).
  The step's RoPE sin/cos is computed once for all layers (``_step_rotary``). In float32 on CPU
  the step's small operations run inside its kernel calls (``fused``: each norm with the product
  after it, the MLP's gating, a self-attention after its q | k | v product, the residual adds):
  a 4-layer step runs 14 small XLA operations instead of ~100.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from t5like.inference import cache as cache_lib
from t5like.inference import fused
from t5like.inference.cache import KVCache
from t5like.kernels import cache_attention
from t5like.models.attention import dot_product_attention
from t5like.models.blocks import SelfContext, layer_mask
from t5like.models.decllm import self_context
from t5like.models.layers import (TransposedKernel, constrain, dtype, kernel, on_cpu, project,
                                  transpose_kernel)
from t5like.models.rotary import Rotary, rotary_table
from t5like.models.stack import LayerStack


class CrossCache(NamedTuple):
  """What RedLLM's decoder needs of the encoder, computed once per prompt."""
  k: tuple[jax.Array, ...]  # Per decoder layer [batch, kv_heads, enc_len, head_dim] cross keys.
  v: tuple[jax.Array, ...]  # Per decoder layer [batch, kv_heads, enc_len, head_dim] values.
  valid_bs: jax.Array  # bool [batch, enc_len]: non-padding encoder tokens.
  enc_len_b: jax.Array  # [batch] encoder (prompt) length of each row.


def run_layers(stack: LayerStack, body: Callable, carry: Any, xs: Any = None,
               count: int | None = None):
  """``body(carry, layer, i, xs_i) -> (carry, y)`` over the stack's first ``count`` (>= 1;
  default all) layers, scanned or unrolled as in training (same stacked parameters either way);
  returns (carry, ys stacked on a layer axis)."""
  graphdef, params = nnx.split(stack.layers)
  count = stack.num_layers if count is None else count

  def step(c, inp):
    p, i, x = inp
    return body(c, nnx.merge(graphdef, p), i, x)

  def indexed_step(c, inp):  # A layer's slice of the stacked arrays, taken inside the loop.
    i, x = inp
    p = jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, i, keepdims=False), params)
    return body(c, nnx.merge(graphdef, p), i, x)

  idx = jnp.arange(count)
  if stack.scan and count == stack.num_layers:
    return jax.lax.scan(step, carry, (params, idx, xs))
  if stack.scan:  # Scanning over params[:count] would copy the stacked arrays first.
    return jax.lax.scan(indexed_step, carry, (idx, xs))
  ys = []
  for i in range(count):
    carry, y = step(carry, jax.tree.map(lambda a, i=i: a[i], (params, idx, xs)))
    ys.append(y)
  return carry, jax.tree.map(lambda *a: jnp.stack(a), *ys)


def layer_at(stack: LayerStack, i: int) -> nnx.Module:
  """Layer ``i`` of the stack as a module (its slice of the stacked parameters)."""
  graphdef, params = nnx.split(stack.layers)
  return nnx.merge(graphdef, jax.tree.map(lambda a: a[i], params))


def unstack(stack: LayerStack, transpose: bool | None = None) -> list[nnx.Module]:
  """One layer module per layer, on its own copy of that layer's parameters (see module doc).

  With ``transpose`` (default: on CPU) the copies of the dense kernels are ``TransposedKernel``s
  (``[out, in]``, the layout XLA:CPU's few-row products read fastest:
  ``benchmarks/decode_layout.py``); otherwise they keep the training layout.
  """
  graphdef, params = nnx.split(stack.layers)
  layers = [nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], params))
            for i in range(stack.num_layers)]
  transpose = on_cpu() if transpose is None else transpose
  if transpose:
    for layer in layers:
      for _, module in nnx.iter_modules(layer):
        for name, n_contract in getattr(module, "KERNELS", {}).items():
          var = getattr(module, name)
          var.set_value(transpose_kernel(var.get_value(), n_contract))
  return layers


class InputKernels(NamedTuple):
  """A decode layer's kernels that read the same input, side by side: one few-row product
  streams each group in one pass (at 8 rows 1.13x faster than one product per kernel; the
  DecLLM 8 x 128 + 64 call ~1.05x)."""
  # Self-attention wq | wk | wv: [(heads + 2 kv_heads) * head_dim, embed]; None: in the layer.
  qkv: TransposedKernel | None
  gate_up: TransposedKernel | None  # SwiGLU wi_gate | wi_up: [2 * d_ff, embed]; None: likewise.


class DecodeWeights(NamedTuple):
  """What the decode step reads of the weights, prepared once per ``generate`` call."""
  layers: list[nnx.Module]  # ``unstack(model.decoder)``; with ``inputs``, minus those kernels.
  table: TransposedKernel | None  # The embedding table for the logits (CPU), else None.
  inputs: list[InputKernels] | None = None  # Per layer (CPU), else None.

  def layer_inputs(self) -> list[InputKernels]:
    """``inputs``, or for every layer none side by side (each kernel in its layer module)."""
    return self.inputs or [InputKernels(None, None)] * len(self.layers)


def decode_weights(model, transpose: bool | None = None) -> DecodeWeights:
  """``unstack`` of the decoder and, with ``transpose`` (default: on CPU), the embedding table
  as a TransposedKernel, which the logits then read as the streamed operand too, and each
  layer's input kernels side by side (``InputKernels``, taken out of the layer modules: the
  decoder's weights are copied once, not twice)."""
  transpose = on_cpu() if transpose is None else transpose
  layers = unstack(model.decoder, transpose)
  inputs = [_side_by_side(_self_attention(model, layer), layer.mlp)
            for layer in layers] if transpose else None
  return DecodeWeights(layers, model.embedding.decode_table() if transpose else None, inputs)


def _self_attention(model, layer) -> nnx.Module:
  return layer.attention if model.cfg.family == "decllm" else layer.self_attention


def _side_by_side(attn, mlp) -> InputKernels:
  def take(module, names):  # TransposedKernels [N_i, K] -> [sum N_i, K]; the module's cleared.
    ws = [getattr(module, name).get_value() for name in names]
    for name in names:
      setattr(module, name, None)
    w_nk = jnp.concatenate([w.w_nk for w in ws])
    return TransposedKernel(w_nk, (w_nk.shape[1], w_nk.shape[0]), 1)
  return InputKernels(take(attn, ("wq", "wk", "wv")), take(mlp, ("wi_gate", "wi_up")))


def _split_qkv(attn, y_b1n, rope_b1: Rotary):
  """``attn.project_qkv`` after its one product over the side-by-side kernels: ``y`` [b, 1,
  (heads + 2 kv_heads) * head_dim] split, normed and rotated."""
  cfg, (b, t, _) = attn.cfg, y_b1n.shape
  q, k, v = jnp.split(y_b1n, [cfg.num_heads * cfg.head_dim, (cfg.num_heads + cfg.kv_heads) *
                              cfg.head_dim], axis=-1)
  heads = lambda x: x.reshape(b, t, -1, cfg.head_dim)  # noqa: E731
  return attn.norm_and_rotate(heads(q), heads(k), heads(v), rope_b1, rope_b1)


def _mlp_residual(mlp, norm, x_b1d, w_gate_up: TransposedKernel | None):
  """``x + mlp(norm(x))`` of one token per row, the MLP's two input products as one over
  ``w_gate_up`` (on CPU in float32 two kernel calls: norm to gating, then ``W_down`` and the
  residual, ``fused``)."""
  if w_gate_up is None:
    return x_b1d + mlp(norm(x_b1d))
  h_b1f = fused.normed_product(norm, x_b1d, w_gate_up, glu=True)
  if h_b1f is not None:
    x_new = fused.plus_product(x_b1d, h_b1f, kernel(mlp.wo, jnp.float32))
    return x_b1d + mlp.down(h_b1f) if x_new is None else x_new
  dt = dtype(mlp.cfg.dtype)
  gate, up = jnp.split(project(norm(x_b1d).astype(dt), w_gate_up.astype(dt)), 2, axis=-1)
  return x_b1d + mlp.combine(gate, up)


def _logits(model, norm, x_b1d, table: TransposedKernel | None = None) -> jax.Array:
  """[batch, vocab] float32 logits of the last position (on CPU one kernel call: ``fused``)."""
  fast = fused.logits(norm, x_b1d[:, -1:], table, model.cfg.d_model)
  return model.embedding.logits(norm(x_b1d), table)[:, -1] if fast is None else fast


def _prompt_attention(q_bthk, k_btgk, v_btgk, mask_bhts, causal: bool = False):
  """``dot_product_attention`` of a prefill; in float32 on one CPU device one call of the
  ``cache_attention`` kernel, each query row under its own mask row (XLA's batched products and
  masked softmax took ~8 ms a layer at 8 x 129 tokens)."""
  # ``applies`` reads dtypes, ranks and head_dim: the same before the transposes below.
  if not isinstance(mask_bhts, jax.Array) or not cache_attention.applies(q_bthk, k_btgk, v_btgk):
    return dot_product_attention(q_bthk, k_btgk, v_btgk, mask_bhts, causal=causal)
  b, t, h, d = q_bthk.shape
  g = k_btgk.shape[2]
  # The core's layout: heads-major, a group's heads stacked along the query rows.
  q_bgrd = jnp.swapaxes(q_bthk * jnp.asarray(d ** -0.5, q_bthk.dtype), 1, 2).reshape(
      b, g, h // g * t, d)
  k_bgsd, v_bgsd = jnp.swapaxes(k_btgk, 1, 2), jnp.swapaxes(v_btgk, 1, 2)
  mask_bgrs = jnp.broadcast_to(mask_bhts, (b, h) + mask_bhts.shape[2:]).reshape(
      b, g, h // g * t, -1)
  out_bgrd = cache_attention.attend(q_bgrd, k_bgsd, v_bgsd, mask_bgrs)
  return jnp.swapaxes(out_bgrd.reshape(b, h, t, d), 1, 2)


def _self_block(block, x_btd, rope_bt: Rotary, mask_bhts, causal: bool):
  """SelfAttentionBlock.__call__ that also returns this layer's keys and values."""
  h = block.pre_attention_norm(x_btd)
  q_bthk, k_btgk, v_btgk = block.attention.project_qkv(h, h, rope_bt, rope_bt)
  x_btd = x_btd + block.attention.project_out(
      _prompt_attention(q_bthk, k_btgk, v_btgk, mask_bhts, causal))
  x_btd = x_btd + block.mlp(block.pre_mlp_norm(x_btd))
  return constrain(x_btd, ("batch", "length", "embed")), (k_btgk, v_btgk)


def _last_self_block(block, x_btd, rope_bt: Rotary, mask_bhts):
  """``_self_block`` for a prefill's last layer, whose output is read at the last position only
  (the first logits): keys and values of every position (the cache), the query, attention, MLP
  and residuals of the last position alone (a fifth of a 4-layer DecLLM's prefill FLOPs
  saved). Returns (x [batch, 1, embed], (k, v))."""
  h = block.pre_attention_norm(x_btd)
  rope_last = Rotary(rope_bt.sin[:, -1:], rope_bt.cos[:, -1:])
  q_b1hk, k_btgk, v_btgk = block.attention.project_qkv(h[:, -1:], h, rope_last, rope_bt)
  x_b1d = x_btd[:, -1:] + block.attention.project_out(
      _prompt_attention(q_b1hk, k_btgk, v_btgk, mask_bhts[:, :, -1:]))
  return x_b1d + block.mlp(block.pre_mlp_norm(x_b1d)), (k_btgk, v_btgk)


def _step_rotary(model, pos_b1) -> Rotary:
  """The step's rotation, computed once for every layer (fused into each layer's query and key
  rotations instead, XLA:CPU computed sin/cos per head and layer: ~0.15 ms of each layer)."""
  return rotary_table(pos_b1, model.cfg.head_dim, model.cfg.rope_max_wavelength)


def _cached_self_attention(attn, norm, x_b1d, rope_b1: Rotary, k_bgsk, v_bgsk, slot, valid_bs,
                           w_qkv: TransposedKernel | None):
  """``x`` plus the self-attention of ``norm(x)``, one new token per row written at ``slot``, over
  every valid slot; returns (x, k cache, v cache). With ``w_qkv`` (q | k | v side by side) one
  product, and on CPU in float32 three kernel calls (``fused``): norm and product, the rest of
  the attention, the output product and the residual."""
  if w_qkv is None:
    h_b1d = norm(x_b1d)
    q_b1hk, k_b1gk, v_b1gk = attn.project_qkv(h_b1d, h_b1d, rope_b1, rope_b1)
  else:
    y_b1n = fused.normed_product(norm, x_b1d, w_qkv)
    if y_b1n is None:  # [b, 1, (heads + 2 kv_heads) * head_dim]
      dt = dtype(attn.cfg.dtype)
      y_b1n = project(norm(x_b1d).astype(dt), w_qkv.astype(dt))
    done = fused.self_attention_step(attn, x_b1d, y_b1n, rope_b1, k_bgsk, v_bgsk, slot, valid_bs)
    if done is not None:
      return done
    q_b1hk, k_b1gk, v_b1gk = _split_qkv(attn, y_b1n, rope_b1)
  k_bgsk = cache_lib.write(k_bgsk, slot, k_b1gk)
  v_bgsk = cache_lib.write(v_bgsk, slot, v_b1gk)
  out_b1hk = cache_lib.attend(q_b1hk, k_bgsk, v_bgsk, valid_bs)
  return x_b1d + attn.project_out(out_b1hk), k_bgsk, v_bgsk


def decllm_prefill(model, tokens_bp, segment_ids_bp, positions_bp, slots: int):
  """Runs the (left-padded) prompt through DecLLM into a cache of ``slots`` slots.

  Masks as in training: causal, or for ``decoder_attention="prefix"`` bidirectional over the
  whole prompt (``decoder_causal_attention`` = the prompt, BOS included), mixed if configured.
  Returns (logits [batch, vocab] of the last prompt token, cache).
  """
  cfg = model.cfg
  prefix_bp = segment_ids_bp if cfg.decoder_attention == "prefix" else None
  ctx: SelfContext = self_context(cfg, segment_ids_bp, positions_bp, cfg.decoder_attention,
                                  prefix_bp, materialize=True)

  def body(x, layer, i, _):
    return _self_block(layer, x, ctx.rope_bt, layer_mask(ctx, i), ctx.causal)

  last = model.decoder.num_layers - 1
  x_bpd, ks, vs = model.embedding.embed(tokens_bp), (), ()
  if last:
    x_bpd, (k_lbpgk, v_lbpgk) = run_layers(model.decoder, body, x_bpd, count=last)
    ks, vs = cache_lib.to_cache_layout(k_lbpgk, slots), cache_lib.to_cache_layout(v_lbpgk, slots)
  x_b1d, (k_bpgk, v_bpgk) = _last_self_block(layer_at(model.decoder, last), x_bpd, ctx.rope_bt,
                                             layer_mask(ctx, jnp.int32(last)))
  valid_bs = jnp.pad(segment_ids_bp > 0, ((0, 0), (0, slots - tokens_bp.shape[1])))
  cache = KVCache(ks + cache_lib.to_cache_layout(k_bpgk[None], slots),
                  vs + cache_lib.to_cache_layout(v_bpgk[None], slots), valid_bs)
  return _logits(model, model.final_norm, x_b1d), cache


def decllm_decode(model, weights: DecodeWeights, token_b, position_b, slot, cache: KVCache):
  """One token per row at cache ``slot`` through ``weights`` (``decode_weights(model)``);
  returns (logits [batch, vocab], cache)."""
  valid_bs = cache_lib.mark_valid(cache.valid_bs, slot, jnp.ones_like(token_b, bool)[:, None])
  rope_b1 = _step_rotary(model, position_b[:, None])
  x_b1d = model.embedding.embed(token_b[:, None])
  ks, vs = [], []
  for layer, w, k_bgsk, v_bgsk in zip(weights.layers, weights.layer_inputs(), cache.k, cache.v):
    x_b1d, k_bgsk, v_bgsk = _cached_self_attention(
        layer.attention, layer.pre_attention_norm, x_b1d, rope_b1, k_bgsk, v_bgsk, slot, valid_bs,
        w.qkv)
    x_b1d = _mlp_residual(layer.mlp, layer.pre_mlp_norm, x_b1d, w.gate_up)
    ks.append(k_bgsk)
    vs.append(v_bgsk)
  return (_logits(model, model.final_norm, x_b1d, weights.table),
          KVCache(tuple(ks), tuple(vs), valid_bs))


def redllm_prefill(model, enc_tokens_bs, slots: int) -> tuple[CrossCache, KVCache]:
  """Encodes the right-padded prompt (``RedLLM.encode``, exactly the training path) and caches
  the cross-attention keys/values of every decoder layer; an empty decoder cache of ``slots``."""
  cfg = model.cfg
  enc = model.encode({"encoder_input_tokens": enc_tokens_bs})
  rope_bs = rotary_table(enc.positions_bs, cfg.head_dim, cfg.rope_max_wavelength)  # Once.

  def body(carry, layer, i, _):
    del i
    _, k, v = layer.cross_attention.project_qkv(enc.encoded_bsd, enc.encoded_bsd, rope_bs,
                                                rope_bs)
    return carry, (k, v)

  _, (k_lbsgk, v_lbsgk) = run_layers(model.decoder, body, None)
  s = enc_tokens_bs.shape[1]
  valid_bs = enc.segment_ids_bs > 0
  cross = CrossCache(cache_lib.to_cache_layout(k_lbsgk, s), cache_lib.to_cache_layout(v_lbsgk, s),
                     valid_bs, jnp.sum(valid_bs, axis=1).astype(jnp.int32))
  empty = cache_lib.empty(cfg.num_decoder_layers, enc_tokens_bs.shape[0], cfg.kv_heads, slots,
                          cfg.head_dim, k_lbsgk.dtype)
  return cross, empty


def redllm_decode(model, weights: DecodeWeights, token_b, position_b, slot, cache: KVCache,
                  cross: CrossCache):
  """One decoder token per row (causal self-attention over the cache, cross-attention to the
  cached encoder keys with RoPE as in training); returns (logits [batch, vocab], cache)."""
  valid_bs = cache_lib.mark_valid(cache.valid_bs, slot, jnp.ones_like(token_b, bool)[:, None])
  rope_b1 = _step_rotary(model, position_b[:, None])
  x_b1d = model.embedding.embed(token_b[:, None])
  ks, vs = [], []
  for layer, w, k_bgsk, v_bgsk, ck_bgsk, cv_bgsk in zip(
      weights.layers, weights.layer_inputs(), cache.k, cache.v, cross.k, cross.v):
    x_b1d, k_bgsk, v_bgsk = _cached_self_attention(
        layer.self_attention, layer.pre_self_attention_norm, x_b1d, rope_b1, k_bgsk, v_bgsk, slot,
        valid_bs, w.qkv)
    h = layer.pre_cross_attention_norm(x_b1d)
    # Query only: keys/values of a zero-length input cost nothing (they are cached in ``cross``).
    q_b1hk, _, _ = layer.cross_attention.project_qkv(h, h[:, :0], rope_b1, rope_b1)
    x_b1d = fused.plus_attention_output(layer.cross_attention, x_b1d,
                                        cache_lib.attend(q_b1hk, ck_bgsk, cv_bgsk, cross.valid_bs))
    x_b1d = _mlp_residual(layer.mlp, layer.pre_mlp_norm, x_b1d, w.gate_up)
    ks.append(k_bgsk)
    vs.append(v_bgsk)
  return (_logits(model, model.decoder_norm, x_b1d, weights.table),
          KVCache(tuple(ks), tuple(vs), valid_bs))
