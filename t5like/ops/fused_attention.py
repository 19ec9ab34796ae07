"""Fused attention cores for accelerators (``model.attention_impl``), fed a
``models.masks.MaskSpec`` instead of a materialised ``[batch, heads, q, kv]`` mask;
``reference.Reference.attention`` sends a MaskSpec here. Each computes the reference core's
formula (``reference.dot_product_attention``), the score soft cap included, or refuses.

- ``splash`` (TPU; Pallas interpret mode on CPU, for the tests): the splash-attention kernel
  with segment ids for packing. Its masks are static and block-sparse, so every per-row mask is
  written as a static mask + segment ids:
  causal -> causal mask; bidirectional and cross-attention -> full mask; mixed
  forward/backward -> causal on forward heads/layers, anti-causal (key >= query) on backward
  ones; the PrefixLM mask, whose bidirectional part differs per row, -> the keys twice:
  ``[causal | strictly above the diagonal]`` over ``[k; k]``, the second copy's segment ids
  kept only on prefix keys. A query then sees a later key only if that key is in its segment's
  prefix, which (a segment's prefix comes first) makes the query a prefix token too.
- ``cudnn`` (NVIDIA GPUs): causal or full attention without a mask array. One example per row
  (``model.max_segments_per_row=1``): ``jax.nn.dot_product_attention(implementation="cudnn")``,
  padding given as sequence lengths. Packed rows: cuDNN's packed layout, segment ids turned into
  per-segment lengths and offsets (``cudnn_packed``; Hopper or newer). Prefix or mixed masks and
  the score soft cap are rejected with an error naming the working alternative.

Both are called per shard through ``partitioning.shard_map_logical``: XLA cannot partition a
custom kernel, so the batch and head axes are split by the rule table first.
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from t5like import partitioning
from t5like.ops import cudnn_packed

MaskSpec = Any  # models.masks.MaskSpec (models call ops, not the other way round).

_QKV = ("batch", "length", "heads", "kv")
_SEG = ("batch", "length")


def platform() -> str:
  """The platform the computation being traced runs on: the mesh's devices (a TPU slice in an
  ahead-of-time compile on a CPU host), else the default backend."""
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty:
    return mesh.abstract_device.platform
  return jax.default_backend()


def attend(impl: str, q_bthk: jax.Array, k_bsgk: jax.Array, v_bsgk: jax.Array,
           spec: MaskSpec, *, max_segments_per_row: int = 1, soft_cap: float = 0.0) -> jax.Array:
  """The core of ``model.attention_impl`` (``splash`` or ``cudnn``) under ``spec``."""
  if impl == "splash":
    return splash_attention(q_bthk, k_bsgk, v_bsgk, spec, soft_cap=soft_cap)
  if impl == "cudnn":
    return cudnn_attention(q_bthk, k_bsgk, v_bsgk, spec, soft_cap=soft_cap,
                           max_segments_per_row=max_segments_per_row)
  raise ValueError(f"a MaskSpec mask needs model.attention_impl 'splash' or 'cudnn', not {impl!r}")


def _block(n: int) -> int:
  return next(b for b in (512, 256, 128) if n % b == 0)


def _pad(x: jax.Array, axis: int, value=0) -> jax.Array:
  """Pads ``axis`` to a multiple of 128 (the kernel's lane width)."""
  n = x.shape[axis]
  extra = -n % 128
  if not extra:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, extra)
  return jnp.pad(x, widths, constant_values=value)


def _splash_kernel(kind: str, t: int, s: int, heads: int, interpret: bool, soft_cap: float):
  """A single-example splash kernel [heads, t, k] x [heads, s, k] for a static ``kind`` (built
  per trace: the kernel holds arrays of the trace it was made in, so it is not cached)."""
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
  if kind == "causal":
    mask = sm.CausalMask((t, s))
  elif kind == "full":
    mask = sm.FullMask((t, s))
  elif kind == "anti":  # Backward heads of mixed attention: key >= query.
    mask = sm.NumpyMask(np.triu(np.ones((t, s), bool)))
  elif kind == "prefix":  # Over [k; k]: causal on the first copy, strictly later on the second.
    half = s // 2
    mask = sm.NumpyMask(np.concatenate([np.tril(np.ones((t, half), bool)),
                                        np.triu(np.ones((t, half), bool), 1)], axis=1))
  else:
    raise ValueError(kind)
  bq, bkv = _block(t), _block(s)
  sizes = sk.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv, block_q_dkv=bq,
                        block_kv_dkv=bkv, block_kv_dkv_compute=bkv, block_q_dq=bq, block_kv_dq=bkv)
  return sk.make_splash_mha(sm.MultiHeadMask([mask] * heads), block_sizes=sizes, head_shards=1,
                            q_seq_shards=1, interpret=interpret,
                            attn_logits_soft_cap=soft_cap or None)


def _splash_shard(kind: str, soft_cap: float, q_bthk, k_bshk, v_bshk, q_seg_bt, kv_seg_bs):
  """Per shard: vmap the single-example kernel over the local batch."""
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
  t, h = q_bthk.shape[1], q_bthk.shape[2]
  kernel = _splash_kernel(kind, t, k_bshk.shape[1], h, platform() == "cpu",  # CPU: interpret.
                          soft_cap)
  out_bhtk = jax.vmap(lambda q, k, v, qs, ks: kernel(q, k, v, segment_ids=sk.SegmentIds(qs, ks)))(
      q_bthk.transpose(0, 2, 1, 3), k_bshk.transpose(0, 2, 1, 3), v_bshk.transpose(0, 2, 1, 3),
      q_seg_bt, kv_seg_bs)
  return out_bhtk.transpose(0, 2, 1, 3)


def _splash(kind: str, soft_cap: float, q, k, v, q_seg, kv_seg):
  fn = partitioning.shard_map_logical(functools.partial(_splash_shard, kind, soft_cap),
                                      (_QKV, _QKV, _QKV, _SEG, _SEG), _QKV)
  return fn(q, k, v, q_seg, kv_seg)


def splash_attention(q_bthk: jax.Array, k_bsgk: jax.Array, v_bsgk: jax.Array,
                     spec: MaskSpec, *, soft_cap: float = 0.0) -> jax.Array:
  """softmax(q k^T / sqrt(d_h)) v under ``spec``; [batch, t, heads, kv]. Padding queries
  (segment 0) give zeros, as on the reference path."""
  if platform() not in ("cpu", "tpu"):  # Mosaic kernels compile for TPUs only.
    raise ValueError(f"attention_impl='splash' is a TPU kernel (run in interpret mode on CPU "
                     f"for tests); on {platform()!r} use model.attention_impl='cudnn' "
                     "or 'reference'")
  splash = lambda kind, *a: _splash(kind, soft_cap, *a)  # noqa: E731
  b, t, h, kd = q_bthk.shape
  g = k_bsgk.shape[2]
  q_bthk = q_bthk * jnp.asarray(kd ** -0.5, q_bthk.dtype)
  k_bshk = jnp.repeat(k_bsgk, h // g, axis=2)  # Kernel heads are MHA: share the kv groups.
  v_bshk = jnp.repeat(v_bsgk, h // g, axis=2)
  # Lengths padded to the lane width; padding queries (segment 0) match no key (padding -1).
  q_seg = _pad(spec.q_segment_ids_bq, 1)
  kv_seg = _pad(jnp.where(spec.kv_segment_ids_bk > 0, spec.kv_segment_ids_bk, -1), 1, -1)
  q_bthk, k_bshk, v_bshk = _pad(q_bthk, 1), _pad(k_bshk, 1), _pad(v_bshk, 1)
  if spec.kind == "prefix":
    if spec.mixed != "none":
      raise ValueError("attention_impl='splash' has no mixed forward/backward PrefixLM mask; "
                       "use model.attention_impl='reference'")
    prefix_kv = jnp.where(_pad(spec.prefix_bt, 1).astype(bool), kv_seg, -2)
    out = splash("prefix", q_bthk, jnp.concatenate([k_bshk, k_bshk], 1),
                 jnp.concatenate([v_bshk, v_bshk], 1), q_seg,
                 jnp.concatenate([kv_seg, prefix_kv], 1))
  elif spec.kind == "causal" or spec.mixed == "none":
    out = splash({"causal": "causal", "bidirectional": "full", "cross": "full"}[spec.kind],
                 q_bthk, k_bshk, v_bshk, q_seg, kv_seg)
  elif spec.mixed == "per_head":  # Heads [0, H/2) forward, [H/2, H) backward.
    m = h // 2
    out = jnp.concatenate([
        splash("causal", q_bthk[:, :, :m], k_bshk[:, :, :m], v_bshk[:, :, :m], q_seg, kv_seg),
        splash("anti", q_bthk[:, :, m:], k_bshk[:, :, m:], v_bshk[:, :, m:], q_seg, kv_seg)],
        axis=2)
  else:  # per_layer: this layer's direction may be traced (layer index under scan).
    out = jax.lax.cond(spec.backward,
                       lambda *a: splash("anti", *a), lambda *a: splash("causal", *a),
                       q_bthk, k_bshk, v_bshk, q_seg, kv_seg)
  return jnp.where((q_seg > 0)[:, :t, None, None], out[:, :t], 0).astype(q_bthk.dtype)


# Whether a core attends rows whose padding comes first (generation's left-padded prompts):
# splash masks by segment ids wherever they are; cuDNN counts lengths (and the packed layout's
# offsets) from position 0, so a left-padded row would read its padding: such rows give NaN.
SERVES_LEADING_PADDING = {"splash": True, "cudnn": False}


def cudnn_attention(q_bthk: jax.Array, k_bsgk: jax.Array, v_bsgk: jax.Array, spec: MaskSpec, *,
                    max_segments_per_row: int = 1, soft_cap: float = 0.0,
                    implementation: str | None = "cudnn") -> jax.Array:
  """cuDNN's fused attention with causal / full masks; packed rows through its packed layout.

  ``max_segments_per_row``: 1 = one example per row (``jax.nn.dot_product_attention`` with
  padding as lengths); else the packed layout's slots (0 = auto, ``cudnn_packed``).
  ``implementation="xla"`` runs XLA's version of the same call (how the CPU tests check the
  translation of the spec). A row that breaks its layout (several segments where one is
  expected, more than the slots) gives NaN: the host check (``cudnn_packed.check_batch``) names
  the problem first.
  """
  if spec.kind == "prefix" or (spec.mixed != "none" and spec.kind != "causal"):
    raise ValueError("attention_impl='cudnn' expresses causal and full attention only; the "
                     f"{spec.kind} mask with mixed={spec.mixed!r} needs model.attention_impl="
                     "'reference'")
  if soft_cap:
    raise ValueError(f"attention_impl='cudnn' has no attention_logit_soft_cap ({soft_cap}); "
                     "use model.attention_impl='reference'")
  if max_segments_per_row != 1:
    return cudnn_packed.packed_attention(
        q_bthk, k_bsgk, v_bsgk, spec.q_segment_ids_bq, spec.kv_segment_ids_bk,
        causal=spec.kind == "causal", configured_segments=max_segments_per_row,
        implementation=implementation or "cudnn")
  q_len = jnp.sum(spec.q_segment_ids_bq > 0, axis=1).astype(jnp.int32)
  kv_len = jnp.sum(spec.kv_segment_ids_bk > 0, axis=1).astype(jnp.int32)
  out = jax.nn.dot_product_attention(
      q_bthk, k_bsgk, v_bsgk, is_causal=spec.kind == "causal", query_seq_lengths=q_len,
      key_value_seq_lengths=kv_len, implementation=implementation)
  out = jnp.where((spec.q_segment_ids_bq > 0)[:, :, None, None], out, 0)
  broken = jnp.zeros(q_len.shape, bool)
  for seg in (spec.q_segment_ids_bq, spec.kv_segment_ids_bk):  # Not one example per row, or
    broken |= (jnp.max(seg, axis=1) > 1) | ((seg[:, 0] == 0) & (jnp.max(seg, axis=1) > 0))
  return jnp.where(broken[:, None, None, None], jnp.nan, out).astype(q_bthk.dtype)  # padding first.
