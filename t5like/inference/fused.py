"""The decode step's fused CPU paths (``t5like/kernels``), each one kernel call.

Around the kernels' products a 4-layer step ran ~100 small XLA operations (norms, the q/k/v
split, RoPE, cache writes, SwiGLU gating, residual adds); fused, 14 remain, and a small DecLLM
call is 1.02-1.03x faster on a 2-core host (docs/performance.md). Where the kernels apply
(float32 operands, one CPU device, the library built: ``few_row.applies``,
``cache_attention.step_applies``) each function here does the same arithmetic as the model's
modules in one call; elsewhere it returns None and ``steps`` runs the modules.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from t5like.kernels import cache_attention, few_row
from t5like.models.layers import TransposedKernel, kernel
from t5like.models.norms import RMSNorm
from t5like.models.rotary import Rotary


def _rows(x_btk: jax.Array) -> jax.Array:
  return x_btk.reshape(-1, x_btk.shape[-1])


def normed_product(norm, x_b1d: jax.Array, w, glu: bool = False) -> jax.Array | None:
  """``norm(x) @ w`` (with ``glu``: then ``silu(gate) * up`` of its two halves), [b, 1, n]."""
  b, t, k = x_b1d.shape
  if not (isinstance(norm, RMSNorm) and norm.scale.shape == (k,)
          and isinstance(w, TransposedKernel) and few_row.applies(_rows(x_b1d), w.w_nk)):
    return None
  y = few_row.fused_matmul(_rows(x_b1d), w.w_nk, norm_scale=norm.scale[...], eps=norm.eps,
                           glu=glu)
  return y.reshape(b, t, -1)


def plus_product(x_b1d: jax.Array, h_b1f: jax.Array, w) -> jax.Array | None:
  """``x + h @ w``: a residual branch's output product (h's trailing axes contracted)."""
  b, t, d = x_b1d.shape
  h_mk = h_b1f.reshape(b * t, -1)
  if not (isinstance(w, TransposedKernel) and x_b1d.dtype == jnp.float32
          and few_row.applies(h_mk, w.w_nk)):
    return None
  return few_row.fused_matmul(h_mk, w.w_nk, residual=_rows(x_b1d)).reshape(b, t, d)


def self_attention_step(attn, x_b1d: jax.Array, y_b1n: jax.Array, rope_b1: Rotary, k_bgsk,
                        v_bgsk, slot, valid_bs):
  """``x`` plus a self-attention step after its q | k | v product ``y`` [b, 1, (heads + 2
  kv_heads) * head_dim]: norms, RoPE, the cache writes and attention in one call
  (``cache_attention.attend_step``), then ``plus_attention_output``. Returns (x, k cache,
  v cache), or None where the kernel does not apply."""
  cfg, (b, _, n) = attn.cfg, y_b1n.shape
  if not cache_attention.step_applies(y_b1n.reshape(b, n), k_bgsk, v_bgsk):
    return None
  scales, eps = None, 0.0
  if cfg.qkv_norm:
    norms = (attn.q_norm, attn.k_norm, attn.v_norm)
    scales, eps = jnp.stack([m.scale[...] for m in norms]), norms[0].eps
  rope = jnp.stack([rope_b1.sin.reshape(b, -1), rope_b1.cos.reshape(b, -1)]) \
      if attn.use_rope else None
  out_bgrk, k_bgsk, v_bgsk = cache_attention.attend_step(
      y_b1n.reshape(b, n), scales, eps, rope, k_bgsk, v_bgsk, slot, valid_bs)
  out_b1hk = out_bgrk.reshape(b, 1, -1, cfg.head_dim)
  return plus_attention_output(attn, x_b1d, out_b1hk), k_bgsk, v_bgsk


def plus_attention_output(attn, x_b1d: jax.Array, out_b1hk: jax.Array) -> jax.Array:
  """``x + attn.project_out(out)``, the residual add fused into the output product (the
  output norm, RedLLM's, stays an XLA operation)."""
  normed_b1hk = attn.out_norm(out_b1hk) if attn.cfg.attn_out_norm else out_b1hk
  x_new = plus_product(x_b1d, normed_b1hk, kernel(attn.wo, jnp.float32))
  return x_b1d + attn.project_out(out_b1hk) if x_new is None else x_new


def logits(norm, x_b1d: jax.Array, table: TransposedKernel | None,
           d_model: int) -> jax.Array | None:
  """``TiedEmbedding.logits(norm(x), table)[:, -1]``: [b, vocab] from the final norm, the
  ``d_model^-1/2`` factor and the table's product in one call."""
  b, t, k = x_b1d.shape
  if not (t == 1 and table is not None and isinstance(norm, RMSNorm)
          and norm.scale.shape == (k,) and few_row.applies(_rows(x_b1d), table.w_nk)):
    return None
  return few_row.fused_matmul(_rows(x_b1d), table.w_nk, norm_scale=norm.scale[...],
                              eps=norm.eps, factor=d_model ** -0.5)
