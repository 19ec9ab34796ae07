"""Multi-head dot-product attention for self- and cross-attention (docs/paper.md §1).

DecLLM: ``softmax(LN(Q) LN(K)^T / sqrt(d_h)) LN(V)``; RedLLM adds ``LN`` on the attention output
(``attn_out_norm``), per head or over all heads, before the output projection. RoPE rotates
queries and keys by their own explicit positions, so cross-attention with continuous positions
encodes the true decoder-to-encoder distance. Optional grouped key/value heads.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from t5like.config.model import ModelConfig
from t5like.kernels import attention_train, head_norm
from t5like.models.layers import (constrain, dropout, dtype, fan_in_init, fold, kernel, param,
                                  project)
from t5like.models.masks import MaskSpec
from t5like.models.norms import RMSNorm
from t5like.models.rotary import Rotary, apply_rope, as_rotary

try:  # Names the output so the "attention_out" remat policy can save it.
  from jax.ad_checkpoint import checkpoint_name
except ImportError:  # pragma: no cover
  def checkpoint_name(x, name):
    del name
    return x

NEG_INF = -0.7 * float(jnp.finfo(jnp.float32).max)  # Finite, so fully-masked rows stay NaN-free.
CAUSAL_BLOCK = 128  # Fewest query rows per block of a causal mask (``dot_product_attention``),
CAUSAL_MAX_BLOCKS = 8  # and most blocks: at 2,048 tokens 8 blocks of 256 (TPU compile time).


class Attention(nnx.Module):
  KERNELS = {"wq": 1, "wk": 1, "wv": 1, "wo": 2}  # Kernel -> its contracted (leading) axes.

  def __init__(self, cfg: ModelConfig, *, use_rope: bool = True, rngs: nnx.Rngs):
    self.cfg = cfg
    self.use_rope = use_rope
    d, h, g, k = cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.head_dim
    pd = cfg.param_dtype
    self.wq = param(rngs, fan_in_init(d), (d, h, k), ("embed", "heads", "kv"), pd)
    self.wk = param(rngs, fan_in_init(d), (d, g, k), ("embed", "heads", "kv"), pd)
    self.wv = param(rngs, fan_in_init(d), (d, g, k), ("embed", "heads", "kv"), pd)
    self.wo = param(rngs, fan_in_init(h * k), (h, k, d), ("heads", "kv", "embed"), pd)
    norm = dict(eps=cfg.norm_eps, param_dtype=pd, rngs=rngs)
    if cfg.qkv_norm:
      self.q_norm = RMSNorm((k,), ("kv",), **norm)
      self.k_norm = RMSNorm((k,), ("kv",), **norm)
      self.v_norm = RMSNorm((k,), ("kv",), **norm)
    if cfg.attn_out_norm:
      if cfg.attn_out_norm_scope == "per_head":
        self.out_norm = RMSNorm((k,), ("kv",), **norm)
      else:
        self.out_norm = RMSNorm((h, k), ("heads", "kv"), **norm)

  def project_qkv(self, x_q_btd: jax.Array, x_kv_bsd: jax.Array, q_pos_bt: jax.Array | Rotary,
                  kv_pos_bs: jax.Array | Rotary, *, float32: bool = False
                  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Normed, rotated q [batch, t, heads, kv], k and v [batch, s, kv_heads, kv]; positions are
    integer [batch, length] arrays or their ``rotary_table`` (computed once per forward).
    ``float32``: return them in float32 whatever the model's dtype (see ``norm_and_rotate``).

    A KV cache stores the k, v of this step; ``attend`` and ``project_out`` finish the layer.
    """
    dt = dtype(self.cfg.dtype)
    xq, xkv = x_q_btd.astype(dt), x_kv_bsd.astype(dt)
    q_bthk = project(xq, kernel(self.wq, dt))  # btd,dhk->bthk
    k_bsgk = project(xkv, kernel(self.wk, dt))  # bsd,dgk->bsgk
    v_bsgk = project(xkv, kernel(self.wv, dt))
    return self.norm_and_rotate(q_bthk, k_bsgk, v_bsgk, q_pos_bt, kv_pos_bs, float32=float32)

  def norm_and_rotate(self, q_bthk: jax.Array, k_bsgk: jax.Array, v_bsgk: jax.Array,
                      q_pos_bt: jax.Array | Rotary, kv_pos_bs: jax.Array | Rotary, *,
                      float32: bool = False) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``project_qkv`` after its three products: the QKV norms and RoPE (also the end of the
    decode step's single product over the side-by-side kernels, ``inference/steps.py``).
    ``float32``: norms and RoPE (computed in float32 anyway) hand on float32 rather than the
    model's dtype, for an attention core that computes in float32 (``kernels.attention_train``):
    no round trip through bfloat16 between them (bfloat16 step 1.02x on a Zen 4)."""
    cfg = self.cfg
    fused = cfg.qkv_norm and self._fused_norm_and_rotate(q_bthk, k_bsgk, v_bsgk, q_pos_bt,
                                                         kv_pos_bs, float32)
    if fused:
      q_bthk, k_bsgk, v_bsgk = fused
    else:
      if float32:
        q_bthk, k_bsgk, v_bsgk = (x.astype(jnp.float32) for x in (q_bthk, k_bsgk, v_bsgk))
      if cfg.qkv_norm:
        q_bthk, k_bsgk, v_bsgk = self.q_norm(q_bthk), self.k_norm(k_bsgk), self.v_norm(v_bsgk)
      if self.use_rope:
        q_bthk = apply_rope(q_bthk, q_pos_bt, cfg.rope_max_wavelength)
        k_bsgk = apply_rope(k_bsgk, kv_pos_bs, cfg.rope_max_wavelength)
    q_bthk = constrain(q_bthk, ("batch", "length", "heads", "kv"))
    k_bsgk = constrain(k_bsgk, ("batch", "length", "heads", "kv"))
    v_bsgk = constrain(v_bsgk, ("batch", "length", "heads", "kv"))
    return q_bthk, k_bsgk, v_bsgk

  def _fused_norm_and_rotate(self, q_bthk, k_bsgk, v_bsgk, q_pos_bt, kv_pos_bs, float32):
    """The QKV norms and RoPE in one kernel per tensor on one CPU device (``kernels.head_norm``:
    the same float32 arithmetic in one pass, not ~10 XLA:CPU kernels); float32 out where
    ``float32``, else the projections' dtype. None where the kernel does not apply."""
    cfg = self.cfg
    if not head_norm.applies(q_bthk):  # Before any table is made.
      return None
    rots = [as_rotary(p, cfg.head_dim, cfg.rope_max_wavelength) if self.use_rope else None
            for p in (q_pos_bt, kv_pos_bs)] + [None]
    xs, norms = (q_bthk, k_bsgk, v_bsgk), (self.q_norm, self.k_norm, self.v_norm)
    if not all(head_norm.applies(x, rot) for x, rot in zip(xs, rots)):
      return None
    ys = [head_norm.norm_rope(x, norm.scale[...], rot, norm.eps)
          for x, norm, rot in zip(xs, norms, rots)]
    return tuple(y if float32 else y.astype(x.dtype) for x, y in zip(xs, ys))

  def project_out(self, out_bthk: jax.Array) -> jax.Array:
    """Attention-output norm (RedLLM) and output projection: [b, t, h, k] -> [b, t, d]."""
    cfg = self.cfg
    if cfg.attn_out_norm:
      out_bthk = self.out_norm(out_bthk)
    out_bthk = checkpoint_name(constrain(out_bthk, ("batch", "length", "heads", "kv")),
                               "attention_out")
    return project(out_bthk, kernel(self.wo, dtype(cfg.dtype)), 2)  # bthk,hkd->btd

  def __call__(self, x_q_btd: jax.Array, x_kv_bsd: jax.Array, q_pos_bt: jax.Array | Rotary,
               kv_pos_bs: jax.Array | Rotary, mask_bhts: jax.Array | MaskSpec, *,
               causal: bool = False, rng: jax.Array | None = None) -> jax.Array:
    """Attends from ``x_q`` [batch, t, d] to ``x_kv`` [batch, s, d]; returns [batch, t, d].
    ``causal``: the mask allows no key after its query (lets the core skip those blocks)."""
    cpu_core = self._cpu_kernel_core(x_q_btd, x_kv_bsd, mask_bhts, rng)
    q_bthk, k_bsgk, v_bsgk = self.project_qkv(x_q_btd, x_kv_bsd, q_pos_bt, kv_pos_bs,
                                              float32=cpu_core)
    if cpu_core:  # The kernel's float32 core, its output back in the model's dtype.
      out_bthk = attention_train.attend(q_bthk, k_bsgk, v_bsgk, mask_bhts)
      return self.project_out(out_bthk.astype(dtype(self.cfg.dtype)))
    if isinstance(mask_bhts, MaskSpec):  # Fused kernel (model.attention_impl), mask never built.
      from t5like.models import attention_kernels
      if self.cfg.attention_impl == "splash":
        out_bthk = attention_kernels.splash_attention(q_bthk, k_bsgk, v_bsgk, mask_bhts)
      else:
        out_bthk = attention_kernels.cudnn_attention(q_bthk, k_bsgk, v_bsgk, mask_bhts)
    else:
      out_bthk = dot_product_attention(q_bthk, k_bsgk, v_bsgk, mask_bhts, causal=causal,
                                       dropout_rate=self.cfg.dropout_rate, rng=fold(rng, 0))
    return self.project_out(out_bthk)

  def _cpu_kernel_core(self, x_q_btd: jax.Array, x_kv_bsd: jax.Array,
                       mask_bhts: jax.Array | MaskSpec, rng: jax.Array | None) -> bool:
    """Whether ``kernels.attention_train`` serves this call's core (``dot_product_attention``'s
    test, on the q, k, v shapes this layer will make, in float32)."""
    cfg = self.cfg
    if isinstance(mask_bhts, MaskSpec) or (cfg.dropout_rate > 0.0 and rng is not None):
      return False
    b, t, s = x_q_btd.shape[0], x_q_btd.shape[1], x_kv_bsd.shape[1]
    f32 = jnp.float32
    return attention_train.applies(jax.ShapeDtypeStruct((b, t, cfg.num_heads, cfg.head_dim), f32),
                                   jax.ShapeDtypeStruct((b, s, cfg.kv_heads, cfg.head_dim), f32),
                                   jax.ShapeDtypeStruct((b, s, cfg.kv_heads, cfg.head_dim), f32),
                                   mask_bhts)


def dot_product_attention(q_bthk: jax.Array, k_bsgk: jax.Array, v_bsgk: jax.Array,
                          mask_bhts: jax.Array, *, causal: bool = False,
                          dropout_rate: float = 0.0, rng: jax.Array | None = None) -> jax.Array:
  """softmax(q k^T / sqrt(d_h)) v with grouped kv heads; returns [batch, t, heads, kv].

  ``mask_bhts`` is bool [batch, heads|1, t, s]; a fully-masked query row gives zeros. With
  ``causal`` (the mask allows no key after its query: causal and packed-causal self-attention,
  t == s) the queries go in blocks of at least ``CAUSAL_BLOCK`` rows (at most
  ``CAUSAL_MAX_BLOCKS`` blocks), each attending only the keys up to its own last row: the
  skipped keys are masked for every query of the block, so the result is the same softmax,
  without their scores, exponentials and products (the core's forward and backward on XLA:CPU,
  f32: 1.34x at 256 tokens, 1.8x at 512, 1.5-2x at 1024 and 2048; docs/performance.md).
  On one CPU device, float32 without dropout, ``kernels.attention_train`` computes the same
  (each query over its first to last allowed key only).
  """
  if (dropout_rate == 0.0 or rng is None) and attention_train.applies(q_bthk, k_bsgk, v_bsgk,
                                                                      mask_bhts):
    return attention_train.attend(q_bthk, k_bsgk, v_bsgk, mask_bhts)  # CPU, one device, f32.
  t = q_bthk.shape[1]
  block = max(CAUSAL_BLOCK, -(-t // CAUSAL_MAX_BLOCKS))
  if not causal or t <= block:
    return _attend(q_bthk, k_bsgk, v_bsgk, mask_bhts, dropout_rate, rng)
  assert k_bsgk.shape[1] == t, "a causal mask pairs every query with its own key position"
  out = []
  for i, start in enumerate(range(0, t, block)):
    end = min(start + block, t)
    out.append(_attend(q_bthk[:, start:end], k_bsgk[:, :end], v_bsgk[:, :end],
                       mask_bhts[:, :, start:end, :end], dropout_rate, fold(rng, i)))
  return jnp.concatenate(out, axis=1)


def _attend(q_bthk: jax.Array, k_bsgk: jax.Array, v_bsgk: jax.Array, mask_bhts: jax.Array,
            dropout_rate: float, rng: jax.Array | None) -> jax.Array:
  """The attention core over the whole given key range: [batch, t, heads, kv]."""
  dt = q_bthk.dtype
  b, t, h, k = q_bthk.shape
  g = k_bsgk.shape[2]
  probs_bhts = attention_weights(q_bthk, k_bsgk, mask_bhts).astype(dt)
  probs_bhts = dropout(probs_bhts, dropout_rate, rng)
  probs_bgqs = probs_bhts.reshape(b, g, h // g * t, -1)  # q = (head in group, query).
  out_bgqk = jnp.einsum("bgqs,bgsk->bgqk", probs_bgqs, _heads_major(v_bsgk))
  return _heads_major(out_bgqk.reshape(b, h, t, k))


def _heads_major(x_bsgk: jax.Array) -> jax.Array:
  """[batch, s, heads, kv] <-> [batch, heads, s, kv]. The attention core runs its two products
  as 4-D batched matmuls over (batch, kv head) on heads-major operands, the queries of a group's
  heads stacked along the query axis: XLA:CPU ran the core (forward and backward) 1.3-1.5x
  faster than with [batch, s, heads, kv] operands and a separate group axis inside the einsums
  (docs/performance.md)."""
  return jnp.swapaxes(x_bsgk, 1, 2)


def attention_weights(q_bthk: jax.Array, k_bsgk: jax.Array, mask_bhts: jax.Array) -> jax.Array:
  """float32 attention probabilities [batch, heads, t, s]; fully-masked rows are all zero."""
  dt = q_bthk.dtype
  b, t, h, k = q_bthk.shape
  g = k_bsgk.shape[2]
  q_bgqk = _heads_major(q_bthk * jnp.asarray(k ** -0.5, dt)).reshape(b, g, h // g * t, k)
  scores_bgqs = jnp.einsum("bgqk,bgsk->bgqs", q_bgqk, _heads_major(k_bsgk),
                           preferred_element_type=jnp.float32)
  scores_bhts = scores_bgqs.reshape(b, h, t, -1)
  # The mask as an additive bias (built at [batch, heads|1, t, s], not at the scores' size): a
  # masked score becomes NEG_INF + score, whose exp is exactly 0 beside any unmasked one. One
  # elementwise pass fewer than masking scores and probabilities, forward and backward.
  scores_bhts = scores_bhts + jnp.where(mask_bhts, 0.0, NEG_INF)
  # Fully-masked (padding) rows attend to nothing at all.
  live_bht1 = jnp.any(mask_bhts, axis=-1, keepdims=True)
  return jax.nn.softmax(scores_bhts, axis=-1) * live_bht1
