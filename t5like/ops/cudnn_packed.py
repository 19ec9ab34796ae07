"""cuDNN's packed (THD-style) fused attention, fed from seqio's segment ids.

cuDNN isolates the examples of a packed row by per-segment lengths and offsets, not by a mask:
for row ``b``, ``seqlen[b, m]`` is how many tokens segment ``m`` has and ``offsets[b, m]`` where
it starts (``-1`` for the slots a row does not use; ``offsets`` has one more column, always
``-1``). The rows come from seqio's packing: segments 1..n, contiguous and in order from position
0, padding (id 0) at the end, so segment ``m`` starts after the tokens of segments ``< m``
(slot ``m - 1`` holds segment id ``m``).

The number of slots ``M`` per row is static (``model.max_segments_per_row``; 0 = ``length // 32``)
and cuDNN's saved softmax statistics grow with it (``[batch * M, heads, length]`` float32). A row
with more segments, or not laid out as above, is never attended silently: ``check_batch`` refuses
it on the host with a clear error (the trainer calls it on every batch) and, in the graph, such a
batch's attention output is NaN.

JAX 0.10 exposes the packed layout only on its internal cuDNN entry point
(``jax._src.cudnn.fused_attention_stablehlo.dot_product_attention``; the public
``jax.nn.dot_product_attention`` takes no offsets). This module relies on that signature
(checked, with an error naming the fix where it is missing) and was written against 0.10.2.
In JAX <= 0.11.0 that entry point scales the key offsets by the *query* head count, so grouped
K/V heads would read the wrong keys without any error: there K/V heads are repeated to the query
count first (``kv_heads_for_packed``).
"""
from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np

from t5like.config import ConfigError

_ENTRY = "jax._src.cudnn.fused_attention_stablehlo.dot_product_attention"
_NEEDED_ARGS = ("q_seqlen", "kv_seqlen", "q_offsets", "kv_offsets", "mask_type", "scale")
# The last JAX release whose packed path multiplies kv_offsets by the query head count.
LAST_KV_OFFSET_BUG = (0, 11, 0)
SEGMENTS_PER_LENGTH = 32  # Auto slots: one per 32 tokens of the row (2048 -> 64 segments).


def max_segments(configured: int, length: int) -> int:
  """The static number of segment slots per row: ``configured``, or (0) ``length // 32``, at
  least 1 and at most ``length``."""
  m = configured or length // SEGMENTS_PER_LENGTH
  return max(1, min(m, length))


def _version_tuple(version: str) -> tuple[int, ...]:
  out = []
  for part in version.split(".")[:3]:
    digits = "".join(c for c in part if c.isdigit())
    out.append(int(digits or 0))
  return tuple(out)


def needs_kv_head_repeat(jax_version: str | None = None) -> bool:
  """Whether this JAX's packed cuDNN path mis-strides grouped K/V heads (JAX <= 0.11.0)."""
  return _version_tuple(jax_version or jax.__version__) <= LAST_KV_OFFSET_BUG


def kv_heads_for_packed(k_bsgk: jax.Array, v_bsgk: jax.Array, num_heads: int,
                        jax_version: str | None = None) -> tuple[jax.Array, jax.Array]:
  """K/V with as many heads as the queries where ``needs_kv_head_repeat`` (each group's head
  repeated for the query heads it serves, as grouped-query attention shares it), else as given."""
  g = k_bsgk.shape[2]
  if g == num_heads or not needs_kv_head_repeat(jax_version):
    return k_bsgk, v_bsgk
  return jnp.repeat(k_bsgk, num_heads // g, axis=2), jnp.repeat(v_bsgk, num_heads // g, axis=2)


def entry_point():
  """JAX's internal cuDNN attention with the packed-layout arguments, or a clear error (a
  ConfigError: the CLIs print it as one ``error:`` block)."""
  try:
    from jax._src.cudnn import fused_attention_stablehlo as fa
    fn = fa.dot_product_attention
    params = inspect.signature(fn).parameters
    mask_types = fa.MaskType.PADDING, fa.MaskType.PADDING_CAUSAL
  except (ImportError, AttributeError) as e:
    raise ConfigError(f"attention_impl='cudnn' on packed rows needs {_ENTRY} (JAX 0.10.x) and "
                      f"this JAX {jax.__version__} has none ({e}); use "
                      "model.attention_impl='reference', or data.pack=False with "
                      "model.max_segments_per_row=1") from None
  missing = [a for a in _NEEDED_ARGS if a not in params]
  if missing:
    raise ConfigError(f"attention_impl='cudnn' on packed rows: {_ENTRY} of JAX {jax.__version__} "
                      f"takes no {', '.join(missing)} (written for JAX 0.10.x); use "
                      "model.attention_impl='reference', or data.pack=False with "
                      "model.max_segments_per_row=1")
  return fn, mask_types


def check_device() -> None:
  """The packed layout runs on Hopper (compute capability 9.0) or newer only."""
  dev = jax.devices()[0]
  cap = getattr(dev, "compute_capability", None)
  if dev.platform != "gpu" or cap is None:
    raise ConfigError(f"attention_impl='cudnn' runs on NVIDIA GPUs; JAX's device here is "
                      f"{dev.platform!r} ({dev.device_kind}): use model.attention_impl='reference'")
  if tuple(int(x) for x in str(cap).split(".")[:2]) < (9, 0):
    raise ConfigError(f"attention_impl='cudnn' on packed rows needs a Hopper or newer GPU "
                      f"(compute capability >= 9.0); {dev.device_kind} has {cap}: use "
                      "model.attention_impl='reference', or data.pack=False with "
                      "model.max_segments_per_row=1 (the plain cuDNN call)")


def segment_lengths(segment_ids_bt: jax.Array, m: int) -> jax.Array:
  """[b, M] int32: tokens of segment ids 1..M in each row (0 where absent; ids > M are not
  counted: ``layout_problems`` flags those rows)."""
  ids = jnp.where(segment_ids_bt <= m, segment_ids_bt, 0).astype(jnp.int32)
  count = jax.vmap(lambda row: jnp.zeros(m + 1, jnp.int32).at[row].add(1))
  return count(ids)[:, 1:]


def packed_layout(q_segment_ids_bt: jax.Array, kv_segment_ids_bs: jax.Array, m: int):
  """(q_seqlen [b, M], kv_seqlen [b, M], q_offsets [b, M + 1], kv_offsets [b, M + 1]) of
  seqio-packed rows (``layout_problems``), as cuDNN's packed layout takes them.

  Slot ``i`` holds segment id ``i + 1``. A slot is used when the segment has a token on either
  side (cross-attention: a decoder segment whose encoder segment is empty keeps its slot with
  length 0 there, so the two sides' slots stay aligned once JAX drops the ``-1`` entries); unused
  slots are -1. Offsets count the tokens of the earlier segments (rows start at position 0).
  """
  q_len = segment_lengths(q_segment_ids_bt, m)
  kv_len = q_len if kv_segment_ids_bs is q_segment_ids_bt else segment_lengths(kv_segment_ids_bs,
                                                                               m)
  used = (q_len > 0) | (kv_len > 0)

  def side(length_bm):
    start_bm = jnp.cumsum(length_bm, axis=1) - length_bm
    seqlen = jnp.where(used, length_bm, -1).astype(jnp.int32)
    offsets = jnp.where(used, start_bm, -1).astype(jnp.int32)
    return seqlen, jnp.pad(offsets, ((0, 0), (0, 1)), constant_values=-1)

  (q_seqlen, q_offsets), (kv_seqlen, kv_offsets) = side(q_len), side(kv_len)
  return q_seqlen, kv_seqlen, q_offsets, kv_offsets


def mask_from_layout(q_seqlen_bm, kv_seqlen_bm, q_offsets_bm1, kv_offsets_bm1, t: int, s: int,
                     causal: bool) -> jax.Array:
  """The bool mask [b, 1, t, s] that lengths and offsets describe, as cuDNN reads them: the
  queries of slot ``m`` see the keys of slot ``m``; causal: a key no further into its segment
  than the query (top-left aligned). The reference the CPU tests compare with segment masks."""
  def inside(seqlen_bm, offsets_bm1, n):
    pos = jnp.arange(n)
    start, length = offsets_bm1[:, :-1, None], seqlen_bm[:, :, None]
    return (length > 0) & (pos >= start) & (pos < start + length), pos - start  # [b, M, n]
  q_in, q_rel = inside(q_seqlen_bm, q_offsets_bm1, t)
  k_in, k_rel = inside(kv_seqlen_bm, kv_offsets_bm1, s)
  allowed = q_in[:, :, :, None] & k_in[:, :, None, :]
  if causal:
    allowed &= k_rel[:, :, None, :] <= q_rel[:, :, :, None]
  return jnp.any(allowed, axis=1)[:, None]


def layout_problems(segment_ids_bt) -> tuple:
  """(rows not seqio-packed [b], highest segment id [b]) for numpy or jax arrays. A packed row
  holds increasing ids in contiguous runs from position 0, padding 0 only at the end (an id may
  be skipped: an example with nothing on this side, e.g. an empty encoder input)."""
  xp = np if isinstance(segment_ids_bt, np.ndarray) else jnp
  ids = segment_ids_bt
  cur, nxt = ids[:, :-1], ids[:, 1:]
  step_ok = xp.where(cur > 0, (nxt >= cur) | (nxt == 0), nxt == 0)
  bad = ~xp.all(step_ok, axis=1) | xp.any(ids < 0, axis=1)
  return bad, xp.max(ids, axis=1)


def check_batch(configured: int, batch: dict) -> None:
  """Host check of a batch for the packed cuDNN path: rows seqio-packed and at most ``M``
  segments each (a clear error naming ``model.max_segments_per_row`` otherwise)."""
  for key in ("decoder_segment_ids", "encoder_segment_ids"):
    if key not in batch:
      continue
    ids = np.asarray(batch[key])
    m = max_segments(configured, ids.shape[1])
    if m == 1:
      if ids.max(initial=0) > 1:
        raise ConfigError(f"{key} holds packed rows (segment ids up to {ids.max()}) but cuDNN "
                          f"has one slot per row (model.max_segments_per_row={configured}; 1 is "
                          "the plain cuDNN call, 0 = auto is length // 32): set "
                          f"--config.model.max_segments_per_row={ids.max()} or more")
      continue
    bad, most = layout_problems(ids)
    if bad.any():
      r = int(np.argmax(bad))
      raise ConfigError(f"{key} row {r} is not laid out as seqio packs (segments 1..n in "
                        f"increasing runs from position 0, padding 0 at the end): {ids[r][:64]}"
                        "...; attention_impl='cudnn' needs that layout; use 'reference'")
    if most.max() > m:
      raise ConfigError(f"{key} has a row with segment id {int(most.max())}, more than the "
                        f"{m} slots of cuDNN's packed layout (model.max_segments_per_row="
                        f"{configured}{' = auto, length // 32' if not configured else ''}): set "
                        f"--config.model.max_segments_per_row={int(most.max())} or more (at most "
                        f"the length {ids.shape[1]}; each slot adds saved softmax statistics)")


def _zero_outside_segments(attend, q, k, v, aux, in_q_bt, in_kv_bs):
  """``attend(q, k, v, aux)`` whose gradients are zero at the tokens no segment covers
  (padding): the packed layout's kernels need not write those positions of dq, dk and dv.
  Every array is an argument (``aux``: the layout or mask), none closed over."""
  @jax.custom_vjp
  def call(q, k, v, aux, in_q_bt, in_kv_bs):
    return attend(q, k, v, aux)

  def fwd(q, k, v, aux, in_q_bt, in_kv_bs):
    out, vjp = jax.vjp(lambda q, k, v: attend(q, k, v, aux), q, k, v)
    return out, (vjp, in_q_bt, in_kv_bs)

  def bwd(res, ct):
    vjp, in_q_bt, in_kv_bs = res
    dq, dk, dv = vjp(ct)
    keep = lambda g, valid: jnp.where(valid[:, :, None, None], g, 0).astype(g.dtype)  # noqa
    return keep(dq, in_q_bt), keep(dk, in_kv_bs), keep(dv, in_kv_bs), None, None, None

  call.defvjp(fwd, bwd)
  return call(q, k, v, aux, in_q_bt, in_kv_bs)


def packed_attention(q_bthk: jax.Array, k_bsgk: jax.Array, v_bsgk: jax.Array,
                     q_segment_ids_bt: jax.Array, kv_segment_ids_bs: jax.Array, *, causal: bool,
                     configured_segments: int = 0, implementation: str = "cudnn") -> jax.Array:
  """softmax(q k^T / sqrt(d_h)) v over packed rows through cuDNN's packed layout; [b, t, h, k].

  ``causal``: within each segment (DecLLM, RedLLM decoder self-attention); else full within the
  segment (RedLLM encoder; cross-attention with the decoder's segments on ``q_segment_ids_bt``
  and the encoder's on ``kv_segment_ids_bs``). ``implementation="xla"`` runs the same layout
  through ``mask_from_layout`` and XLA's attention (how the CPU tests check it). Padding queries,
  and queries whose segment has no keys, give zeros (as on the ``xla`` path); rows that are not
  seqio-packed or hold more than ``M`` segments give NaN (never silently wrong).
  """
  t, s, h = q_bthk.shape[1], k_bsgk.shape[1], q_bthk.shape[2]
  m = max_segments(configured_segments, max(t, s))
  same = kv_segment_ids_bs is q_segment_ids_bt
  layout = packed_layout(q_segment_ids_bt, q_segment_ids_bt if same else kv_segment_ids_bs, m)
  k_bshk, v_bshk = kv_heads_for_packed(k_bsgk, v_bsgk, h)
  if implementation == "cudnn":
    fn, (padding, padding_causal) = entry_point()
    check_device()

    def attend(q, k, v, layout):
      q_seqlen, kv_seqlen, q_offsets, kv_offsets = layout
      return fn(q, k, v, q_seqlen=q_seqlen, kv_seqlen=kv_seqlen, q_offsets=q_offsets,
                kv_offsets=kv_offsets, scale=q.shape[-1] ** -0.5,
                mask_type=padding_causal if causal else padding)
    aux = layout
  else:
    def attend(q, k, v, mask):
      return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla")
    aux = mask_from_layout(*layout, t, s, causal)
  in_q = (q_segment_ids_bt > 0) & (q_segment_ids_bt <= m)
  in_kv = (kv_segment_ids_bs > 0) & (kv_segment_ids_bs <= m)
  out = _zero_outside_segments(attend, q_bthk, k_bshk, v_bshk, aux, in_q, in_kv)
  kv_len_bm = jnp.maximum(layout[1], 0)
  slot = jnp.clip(q_segment_ids_bt - 1, 0, m - 1)
  has_keys = (q_segment_ids_bt > 0) & (jnp.take_along_axis(kv_len_bm, slot, axis=1) > 0)
  bad_b = jnp.zeros(q_bthk.shape[0], bool)
  for ids in ((q_segment_ids_bt,) if same else (q_segment_ids_bt, kv_segment_ids_bs)):
    not_packed, most = layout_problems(ids)
    bad_b |= not_packed | (most > m)
  out = jnp.where(has_keys[:, :, None, None], out, 0)
  return jnp.where(bad_b[:, None, None, None], jnp.nan, out).astype(q_bthk.dtype)
