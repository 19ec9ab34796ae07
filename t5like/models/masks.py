"""Attention masks from segment ids, causality, a bidirectional prefix and mixed directions.

All masks are boolean, ``True`` = may attend, shaped ``[batch, heads or 1, q_len, kv_len]``.
Segment id 0 marks padding; tokens only see tokens of their own (non-zero) segment, so packed
examples never see each other.

Bidirectional pairs (the RedLLM encoder, the flagged prefix of a PrefixLM decoder) can be replaced
by triangular maps (docs/paper.md §2, "mixed forward/backward attention"): a *forward* head keeps the
causal triangle, a *backward* head sees keys at or after the query inside the bidirectional
region and stays causal elsewhere (it never sees the future of a causal token).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

SELF_KINDS = ("causal", "prefix", "bidirectional")


class MaskSpec(NamedTuple):
  """What a mask is made of, for the fused kernels (``t5like/ops/fused_attention.py``) that
  never build the ``[batch, heads, q, kv]`` array; ``materialize`` gives the array the
  ``xla`` path uses."""
  q_segment_ids_bq: jax.Array  # [batch, q_len] packed segment ids (0 = padding).
  kv_segment_ids_bk: jax.Array  # [batch, kv_len].
  kind: str  # "causal", "prefix", "bidirectional" (self-attention) or "cross".
  prefix_bt: jax.Array | None = None  # [batch, length] prefix flags (kind="prefix").
  mixed: str = "none"  # Mixed forward/backward attention, as in ``self_attention_mask``.
  num_heads: int = 1  # For mixed="per_head".
  backward: Any = False  # For mixed="per_layer": whether this layer is backward (maybe traced).


def materialize(spec: MaskSpec) -> jax.Array:
  """The bool mask ``[batch, heads|1, q, kv]`` of ``spec``."""
  if spec.kind == "cross":
    return cross_attention_mask(spec.q_segment_ids_bq, spec.kv_segment_ids_bk)
  return self_attention_mask(spec.q_segment_ids_bq, kind=spec.kind, prefix_bt=spec.prefix_bt,
                             mixed=spec.mixed, num_heads=spec.num_heads,
                             backward=spec.backward)


def segment_mask(q_segment_ids_bq: jax.Array, kv_segment_ids_bk: jax.Array) -> jax.Array:
  """[batch, 1, q, k]: same non-padding segment."""
  q = q_segment_ids_bq[:, :, None]
  k = kv_segment_ids_bk[:, None, :]
  return ((q == k) & (q > 0))[:, None]


def _pairs(segment_ids_bt: jax.Array, kind: str, prefix_bt: jax.Array | None):
  """Returns (causal [1,1,t,t], anticausal [1,1,t,t], bidirectional-pair [b|1,1,t,t])."""
  t = segment_ids_bt.shape[1]
  # The positions as a loaded vector, not an iota XLA folds into the compare: XLA:TPU spends
  # ~4 s compiling a [t, t] mask kernel with no input (t=2048), a fraction of that otherwise.
  idx = jax.lax.optimization_barrier(jnp.arange(t))
  causal = (idx[None, :] <= idx[:, None])[None, None]
  anti = (idx[None, :] >= idx[:, None])[None, None]
  if kind == "causal":
    bidir = jnp.zeros((1, 1, t, t), bool)
  elif kind == "bidirectional":
    bidir = jnp.ones((1, 1, t, t), bool)
  elif kind == "prefix":
    if prefix_bt is None:
      raise ValueError("a prefix mask needs the `decoder_causal_attention` feature "
                       "([batch, length], 1 on the bidirectional prefix)")
    p = prefix_bt.astype(bool)
    bidir = (p[:, :, None] & p[:, None, :])[:, None]
  else:
    raise ValueError(f"mask kind {kind!r} is not one of {SELF_KINDS}")
  return causal, anti, bidir


def self_attention_mask(segment_ids_bt: jax.Array, *, kind: str,
                        prefix_bt: jax.Array | None = None, mixed: str = "none",
                        num_heads: int = 1, backward: bool | jax.Array = False) -> jax.Array:
  """Self-attention mask.

  Args:
    segment_ids_bt: [batch, length] packed segment ids (0 = padding).
    kind: "causal", "prefix" (bidirectional where ``prefix_bt`` is set on both sides, causal
      elsewhere; seqio's ``decoder_causal_attention``) or "bidirectional".
    prefix_bt: [batch, length] prefix flags, for kind="prefix".
    mixed: "none" (full bidirectional pairs), "per_head" (heads [0, H/2) forward, [H/2, H)
      backward) or "per_layer" (direction given by ``backward``, a possibly traced bool).
    num_heads: number of heads, for mixed="per_head".
    backward: for mixed="per_layer": whether this layer is a backward layer.
  Returns:
    bool [batch, num_heads if mixed == "per_head" else 1, length, length].
  """
  causal, anti, bidir = _pairs(segment_ids_bt, kind, prefix_bt)
  seg = segment_mask(segment_ids_bt, segment_ids_bt)
  if mixed == "none":
    allowed = causal | bidir
  else:
    forward = causal & jnp.ones_like(bidir)
    backward_mask = (causal & ~bidir) | (bidir & anti)
    if mixed == "per_head":
      is_back_h = (jnp.arange(num_heads) >= num_heads // 2)[None, :, None, None]
      allowed = jnp.where(is_back_h, backward_mask, forward)
    elif mixed == "per_layer":
      allowed = jnp.where(backward, backward_mask, forward)
    else:
      raise ValueError(f"mixed={mixed!r} is not one of none, per_head, per_layer")
  return allowed & seg


def cross_attention_mask(q_segment_ids_bq: jax.Array, kv_segment_ids_bk: jax.Array) -> jax.Array:
  """Decoder queries see every encoder token of the same packed segment."""
  return segment_mask(q_segment_ids_bq, kv_segment_ids_bk)
