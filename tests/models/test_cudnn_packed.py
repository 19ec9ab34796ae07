"""cuDNN's packed layout from segment ids (``t5like.ops.cudnn_packed``), checked on CPU: the
mask that the lengths and offsets describe is exactly the segment-id mask (DecLLM causal, RedLLM
encoder / decoder / cross, padding rows, rows with different segment counts); attention through
that layout equals the ``xla`` path, forward and gradients, MHA and GQA; the GQA guard, the slot
count check and the config validation. On a GPU, tests/gpu/test_gpu.py runs cuDNN itself."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import tiny_cfg
from numerics import assert_close_to_scale
from t5like.config import Config, ConfigError
from t5like.models import masks
from t5like.ops import cudnn_packed
from t5like.ops import fused_attention as attention_kernels
from t5like.ops.reference import dot_product_attention

# Four rows of 16: three segments, one, none (all padding), two; padding at the end of some.
DEC = np.array([[1] * 5 + [2] * 7 + [3] * 2 + [0] * 2,
                [1] * 16,
                [0] * 16,
                [1] * 3 + [2] * 13], np.int32)
# The encoder side of the same examples (lengths differ; row 3's example 1 has no input).
ENC = np.array([[1] * 9 + [2] * 4 + [3] * 6 + [0] * 1,
                [1] * 12 + [0] * 8,
                [0] * 20,
                [2] * 20], np.int32)


def _layout_mask(q_ids, kv_ids, causal, m=8):
  q_ids, kv_ids = jnp.asarray(q_ids), jnp.asarray(kv_ids)
  layout = cudnn_packed.packed_layout(q_ids, kv_ids, m)
  return np.asarray(cudnn_packed.mask_from_layout(*layout, q_ids.shape[1], kv_ids.shape[1],
                                                  causal))


def test_layout_of_a_packed_row_is_cudnns_lengths_and_offsets():
  q_seqlen, kv_seqlen, q_off, kv_off = (
      np.asarray(x) for x in cudnn_packed.packed_layout(jnp.asarray(DEC), jnp.asarray(ENC), 4))
  np.testing.assert_array_equal(q_seqlen, [[5, 7, 2, -1], [16, -1, -1, -1], [-1] * 4,
                                           [3, 13, -1, -1]])
  np.testing.assert_array_equal(q_off, [[0, 5, 12, -1, -1], [0, -1, -1, -1, -1], [-1] * 5,
                                        [0, 3, -1, -1, -1]])
  # Row 3: segment 1 has no encoder tokens but keeps its slot (length 0), aligned with the
  # decoder's, so JAX's removal of the -1 entries pairs the right segments.
  np.testing.assert_array_equal(kv_seqlen, [[9, 4, 6, -1], [12, -1, -1, -1], [-1] * 4,
                                            [0, 20, -1, -1]])
  np.testing.assert_array_equal(kv_off, [[0, 9, 13, -1, -1], [0, -1, -1, -1, -1], [-1] * 5,
                                         [0, 0, -1, -1, -1]])


@pytest.mark.parametrize("kind", ["causal", "bidirectional"])
@pytest.mark.parametrize("ids", [DEC, ENC], ids=["decoder_rows", "encoder_rows"])
def test_self_attention_mask_from_offsets_is_the_segment_mask(kind, ids):
  """DecLLM and the RedLLM decoder (causal), the RedLLM encoder (bidirectional)."""
  want = np.asarray(masks.self_attention_mask(jnp.asarray(ids), kind=kind))
  np.testing.assert_array_equal(_layout_mask(ids, ids, kind == "causal"), want)


def test_cross_attention_mask_from_offsets_is_the_segment_mask():
  """Queries from the decoder's segments, keys from the encoder's (other lengths, a segment
  with no encoder tokens, padding rows)."""
  want = np.asarray(masks.cross_attention_mask(jnp.asarray(DEC), jnp.asarray(ENC)))
  np.testing.assert_array_equal(_layout_mask(DEC, ENC, False), want)


def test_many_single_token_segments_fill_every_slot():
  ids = np.arange(1, 9, dtype=np.int32)[None]  # Eight one-token segments, M = 8.
  want = np.asarray(masks.self_attention_mask(jnp.asarray(ids), kind="causal"))
  np.testing.assert_array_equal(_layout_mask(ids, ids, True, m=8), want)
  assert want.sum() == 8  # Each token sees itself only.


def _qkv(b, t, s, heads, kv_heads, seed=0):
  r = jax.random.split(jax.random.key(seed), 3)
  return (jax.random.normal(r[0], (b, t, heads, 8)), jax.random.normal(r[1], (b, s, kv_heads, 8)),
          jax.random.normal(r[2], (b, s, kv_heads, 8)))


@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("kind", ["causal", "bidirectional", "cross"])
def test_attention_through_the_layout_equals_the_xla_path(kind, kv_heads):
  """The packed call's own arithmetic (layout -> mask -> XLA attention) equals the model's
  ``xla`` attention on a packed batch, forward and gradients (float32)."""
  q_ids = jnp.asarray(DEC)
  kv_ids = jnp.asarray(ENC) if kind == "cross" else q_ids
  spec = masks.MaskSpec(q_ids, kv_ids, kind)
  q, k, v = _qkv(4, 16, kv_ids.shape[1], 4, kv_heads)
  ct = jax.random.normal(jax.random.key(3), q.shape)

  def loss(fn):
    return lambda q, k, v: jnp.sum(fn(q, k, v) * ct)
  packed = loss(lambda q, k, v: attention_kernels.cudnn_attention(
      q, k, v, spec, max_segments_per_row=4, implementation="xla"))
  ref = loss(lambda q, k, v: dot_product_attention(q, k, v, masks.materialize(spec)))
  out = attention_kernels.cudnn_attention(q, k, v, spec, max_segments_per_row=4,
                                          implementation="xla")
  assert_close_to_scale(out, dot_product_attention(q, k, v, masks.materialize(spec)))
  assert float(jnp.abs(out[2]).max()) == 0.0  # The all-padding row gives zeros.
  grads = jax.grad(packed, argnums=(0, 1, 2))(q, k, v)
  ref_grads = jax.grad(ref, argnums=(0, 1, 2))(q, k, v)
  for name, g, r in zip("qkv", grads, ref_grads):
    assert_close_to_scale(g, r, err_msg=f"d{name}")


@pytest.mark.parametrize("version, repeat", [("0.10.2", True), ("0.11.0", True),
                                             ("0.11.1", False), ("0.12.0.dev20260101", False)])
def test_gqa_guard_repeats_kv_heads_on_the_jax_versions_that_misread_them(version, repeat):
  _, k, v = _qkv(1, 4, 4, 8, 2)
  assert cudnn_packed.needs_kv_head_repeat(version) is repeat
  k2, v2 = cudnn_packed.kv_heads_for_packed(k, v, 8, jax_version=version)
  if repeat:  # Query head i reads kv group i // 4, as grouped-query attention shares it.
    assert k2.shape == (1, 4, 8, 8)
    np.testing.assert_array_equal(k2[:, :, 5], k[:, :, 1])
    np.testing.assert_array_equal(v2[:, :, 3], v[:, :, 0])
  else:
    assert k2 is k and v2 is v


def test_this_jax_gets_the_guard():
  """The pinned JAX (0.10.x) is one of the affected versions: the packed call repeats."""
  assert jax.__version__.startswith("0.10.")
  assert cudnn_packed.needs_kv_head_repeat()


def test_more_segments_than_slots_is_an_error_never_a_silent_drop():
  ids = np.array([[1, 1, 2, 3, 4, 5, 0, 0], [1] * 8], np.int32)
  with pytest.raises(ConfigError, match="max_segments_per_row=5 or more"):
    cudnn_packed.check_batch(4, {"decoder_segment_ids": ids})
  cudnn_packed.check_batch(5, {"decoder_segment_ids": ids})
  # In the graph (a path without the host check): the overflowing row is NaN, the other not.
  q, k, v = _qkv(2, 8, 8, 2, 2)
  spec = masks.MaskSpec(jnp.asarray(ids), jnp.asarray(ids), "causal")
  out = attention_kernels.cudnn_attention(q, k, v, spec, max_segments_per_row=4,
                                          implementation="xla")
  assert bool(jnp.isnan(out[0]).all()) and bool(jnp.isfinite(out[1]).all())


def test_rows_not_packed_by_seqio_are_refused():
  ids = np.array([[1, 1, 2, 1, 0, 0]], np.int32)  # Segment 1 resumes after segment 2.
  with pytest.raises(ConfigError, match="not laid out as seqio packs"):
    cudnn_packed.check_batch(4, {"decoder_segment_ids": ids})
  holes = np.array([[1, 1, 0, 2, 2, 0]], np.int32)  # Padding in the middle.
  with pytest.raises(ConfigError, match="not laid out"):
    cudnn_packed.check_batch(4, {"encoder_segment_ids": holes})
  q, k, v = _qkv(1, 6, 6, 2, 2)
  spec = masks.MaskSpec(jnp.asarray(ids), jnp.asarray(ids), "bidirectional")
  assert bool(jnp.isnan(attention_kernels.cudnn_attention(
      q, k, v, spec, max_segments_per_row=4, implementation="xla")).all())


def test_one_slot_per_row_refuses_packed_rows():
  """max_segments_per_row=1 is the plain call: a packed row there is an error / NaN."""
  ids = np.array([[1, 1, 2, 2], [1, 1, 1, 0]], np.int32)
  with pytest.raises(ConfigError, match="one slot per row.*max_segments_per_row=2 or more"):
    cudnn_packed.check_batch(1, {"decoder_segment_ids": ids})
  cudnn_packed.check_batch(1, {"decoder_segment_ids": ids[1:]})
  q, k, v = _qkv(2, 4, 4, 2, 2)
  spec = masks.MaskSpec(jnp.asarray(ids), jnp.asarray(ids), "causal")
  out = attention_kernels.cudnn_attention(q, k, v, spec, implementation="xla")
  assert bool(jnp.isnan(out[0]).all()) and bool(jnp.isfinite(out[1]).all())


def test_slot_count_is_derived_from_the_length_unless_set():
  assert cudnn_packed.max_segments(0, 2048) == 64
  assert cudnn_packed.max_segments(0, 16) == 1
  assert cudnn_packed.max_segments(100, 2048) == 100
  assert cudnn_packed.max_segments(5000, 2048) == 2048


def test_packed_cudnn_config_validation():
  cfg = Config()
  cfg.model.attention_impl = "cudnn"
  cfg.validate()  # Packed data with cuDNN: the packed layout, auto slots.
  assert cfg.data.pack and cfg.model.max_segments_per_row == 0
  cfg.model.max_segments_per_row = 1
  with pytest.raises(ConfigError, match="cannot isolate data.pack=True"):
    cfg.validate()
  cfg.data.pack, cfg.model.max_segments_per_row = False, 0
  cfg.validate()  # One example per row: the plain cuDNN call.
  assert cfg.model.max_segments_per_row == 1
  with pytest.raises(ConfigError, match="max_segments_per_row"):
    tiny_cfg("decllm", max_segments_per_row=-1)
  tiny_cfg("decllm", attention_impl="cudnn", dtype="float16")  # cuDNN takes fp16 too.


def test_missing_entry_point_or_arguments_are_clear_errors(monkeypatch):
  fn, _ = cudnn_packed.entry_point()  # Present in the pinned JAX.
  assert callable(fn)
  from jax._src.cudnn import fused_attention_stablehlo as fa
  monkeypatch.setattr(fa, "dot_product_attention", lambda query, key, value, mask_type=None: 0)
  with pytest.raises(ValueError, match="takes no q_seqlen, kv_seqlen, q_offsets.*'xla'"):
    cudnn_packed.entry_point()
  monkeypatch.delattr(fa, "dot_product_attention")
  with pytest.raises(ValueError, match="has none.*'xla'"):
    cudnn_packed.entry_point()


def test_packed_cudnn_off_a_gpu_is_a_clear_error():
  ids = jnp.asarray(DEC)
  q, k, v = (x.astype(jnp.bfloat16) for x in _qkv(4, 16, 16, 2, 2))
  with pytest.raises(ValueError, match="runs on NVIDIA GPUs.*'xla'"):
    attention_kernels.cudnn_attention(q, k, v, masks.MaskSpec(ids, ids, "causal"),
                                      max_segments_per_row=4)
