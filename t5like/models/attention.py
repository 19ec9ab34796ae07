"""Multi-head dot-product attention for self- and cross-attention (docs/paper.md §1).

DecLLM: ``softmax(LN(Q) LN(K)^T / sqrt(d_h)) LN(V)``; RedLLM adds ``LN`` on the attention output
(``attn_out_norm``), per head or over all heads, before the output projection. RoPE rotates
queries and keys by their own explicit positions, so cross-attention with continuous positions
encodes the true decoder-to-encoder distance. Optional grouped key/value heads.

With a ``KVCache`` (generation) the keys and values of ``x_kv`` are written into the cache at
``cache_index`` and the queries attend over the whole cache (the mask says which slots); with
``x_kv`` None they attend over the cache as it is (RedLLM's cross-attention after its first step).
A ``prefill`` (the call's tokens are the cache's first) writes them too, but its queries attend
over their own keys under the training masks, through the core training uses.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from t5like import ops as ops_lib
from t5like.config.model import ModelConfig
from t5like.models.layers import constrain, dtype, fan_in_init, fold, param
from t5like.models.masks import MaskSpec
from t5like.models.norms import RMSNorm
from t5like.models.rotary import Rotary, as_rotary

try:  # Names the output so the "attention_out" remat policy can save it.
  from jax.ad_checkpoint import checkpoint_name
except ImportError:  # pragma: no cover
  def checkpoint_name(x, name):
    del name
    return x

QKV_AXES = ("batch", "length", "heads", "kv")


class KVCache(NamedTuple):
  """One attention layer's keys and values, already normed and rotated (a cached key never
  needs its position again): [batch, slots, kv_heads, head_dim] each."""
  k: jax.Array
  v: jax.Array


def write(cache_bsgk: jax.Array, index: jax.Array | int, new_btgk: jax.Array) -> jax.Array:
  """``new`` [batch, t, kv_heads, head_dim] stored at slots ``index .. index + t - 1``."""
  zero = jnp.zeros((), jnp.int32)
  out = jax.lax.dynamic_update_slice(cache_bsgk, new_btgk.astype(cache_bsgk.dtype),
                                     (zero, jnp.asarray(index, jnp.int32), zero, zero))
  return constrain(out, QKV_AXES)


class Attention(nnx.Module):

  def __init__(self, cfg: ModelConfig, *, use_rope: bool = True, rngs: nnx.Rngs):
    self.cfg = cfg
    self.use_rope = use_rope
    self.ops = ops_lib.backend(cfg)
    d, h, g, k = cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.head_dim
    pd = cfg.param_dtype
    kernel = dict(param_dtype=pd, cast_to_compute=True)  # Used in the compute dtype (ops.dense).
    self.wq = param(rngs, fan_in_init(d), (d, h, k), ("embed", "heads", "kv"), **kernel)
    self.wk = param(rngs, fan_in_init(d), (d, g, k), ("embed", "heads", "kv"), **kernel)
    self.wv = param(rngs, fan_in_init(d), (d, g, k), ("embed", "heads", "kv"), **kernel)
    self.wo = param(rngs, fan_in_init(h * k), (h, k, d), ("heads", "kv", "embed"), **kernel)
    norm = dict(eps=cfg.norm_eps, param_dtype=pd, ops=self.ops, rngs=rngs)
    if cfg.qkv_norm:
      self.q_norm = RMSNorm((k,), ("kv",), **norm)
      self.k_norm = RMSNorm((k,), ("kv",), **norm)
      if cfg.v_norm:
        self.v_norm = RMSNorm((k,), ("kv",), **norm)
    if cfg.attn_out_norm:
      if cfg.attn_out_norm_scope == "per_head":
        self.out_norm = RMSNorm((k,), ("kv",), **norm)
      else:
        self.out_norm = RMSNorm((h, k), ("heads", "kv"), **norm)

  def norm_rope(self, x_bthk: jax.Array, norm: str, pos: jax.Array | Rotary | None):
    """The Q/K/V norm ``norm`` (if ``qkv_norm``), then RoPE by ``pos`` (if any and ``use_rope``)."""
    cfg = self.cfg
    scale = getattr(self, norm).scale[...] if hasattr(self, norm) else None  # v_norm=False
    rot = as_rotary(pos, cfg.head_dim, cfg.rope_max_wavelength) \
        if self.use_rope and pos is not None else None
    return constrain(self.ops.norm_rope(x_bthk, scale, rot, cfg.norm_eps), QKV_AXES)

  def project_qkv(self, x_q_btd: jax.Array, x_kv_bsd: jax.Array | None,
                  q_pos_bt: jax.Array | Rotary, kv_pos_bs: jax.Array | Rotary | None
                  ) -> tuple[jax.Array, jax.Array | None, jax.Array | None]:
    """Normed, rotated q [batch, t, heads, kv], k and v [batch, s, kv_heads, kv] (None without
    ``x_kv``); positions are integer [batch, length] arrays or their ``rotary_table``."""
    dt = dtype(self.cfg.dtype)
    q_bthk = self.ops.dense(x_q_btd.astype(dt), self.wq[...])  # btd,dhk->bthk
    q_bthk = self.norm_rope(q_bthk, "q_norm", q_pos_bt)
    if x_kv_bsd is None:
      return q_bthk, None, None
    xkv = x_kv_bsd.astype(dt)
    k_bsgk = self.norm_rope(self.ops.dense(xkv, self.wk[...]), "k_norm", kv_pos_bs)
    v_bsgk = self.norm_rope(self.ops.dense(xkv, self.wv[...]), "v_norm", None)
    return q_bthk, k_bsgk, v_bsgk

  def project_out(self, out_bthk: jax.Array) -> jax.Array:
    """Attention-output norm (RedLLM) and output projection: [b, t, h, k] -> [b, t, d]."""
    if self.cfg.attn_out_norm:
      out_bthk = self.out_norm(out_bthk)
    out_bthk = checkpoint_name(constrain(out_bthk, QKV_AXES), "attention_out")
    return self.ops.dense(out_bthk, self.wo[...], 2)  # bthk,hkd->btd

  def __call__(self, x_q_btd: jax.Array, x_kv_bsd: jax.Array | None,
               q_pos_bt: jax.Array | Rotary, kv_pos_bs: jax.Array | Rotary | None,
               mask_bhts: jax.Array | MaskSpec, *, causal: bool = False,
               rng: jax.Array | None = None, cache: KVCache | None = None,
               cache_index: jax.Array | int = 0, prefill: bool = False
               ) -> tuple[jax.Array, KVCache | None]:
    """Attends from ``x_q`` [batch, t, d] to ``x_kv`` [batch, s, d] (or to ``cache``); returns
    ([batch, t, d], the updated cache). ``causal``: the mask allows no key after its query.
    ``prefill``: the new keys are written to ``cache`` and attended as in training (the mask
    over them, not over the cache's slots)."""
    q_bthk, k_bsgk, v_bsgk = self.project_qkv(x_q_btd, x_kv_bsd, q_pos_bt, kv_pos_bs)
    if cache is not None:
      if k_bsgk is not None:
        cache = KVCache(write(cache.k, cache_index, k_bsgk), write(cache.v, cache_index, v_bsgk))
      if not (prefill and k_bsgk is not None):
        k_bsgk, v_bsgk = cache.k, cache.v
    out_bthk = self.ops.attention(q_bthk, k_bsgk, v_bsgk, mask_bhts, causal=causal,
                                  dropout_rate=self.cfg.dropout_rate, rng=fold(rng, 0))
    return self.project_out(out_bthk), cache
