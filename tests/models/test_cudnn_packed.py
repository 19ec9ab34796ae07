"""cuDNN's packed layout from segment ids (``t5like.ops.cudnn_packed``), checked on CPU: the
mask that the lengths and offsets describe is exactly the segment-id mask (DecLLM causal, RedLLM
encoder / decoder / cross, padding rows, rows with different segment counts); attention through
that layout equals the ``xla`` path, forward and gradients, MHA and GQA; the GQA guard, the slot
count check and the config validation. On a GPU, tests/gpu/test_gpu.py runs cuDNN itself."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import tiny_cfg, tokens
from numerics import assert_close_to_scale
from t5like.config import Config, ConfigError
from t5like.models import build_model, masks
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


# Multi-head (one KV head per head) under ``-m slow``: GQA runs the same layout (make test's budget).
@pytest.mark.parametrize("kv_heads", [pytest.param(4, marks=pytest.mark.slow), 2], ids=["mha", "gqa"])
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
  with pytest.raises(ValueError, match="takes no q_seqlen, kv_seqlen, q_offsets.*'reference'"):
    cudnn_packed.entry_point()
  monkeypatch.delattr(fa, "dot_product_attention")
  with pytest.raises(ValueError, match="has none.*'reference'"):
    cudnn_packed.entry_point()


def test_packed_cudnn_off_a_gpu_is_a_clear_error():
  ids = jnp.asarray(DEC)
  q, k, v = (x.astype(jnp.bfloat16) for x in _qkv(4, 16, 16, 2, 2))
  with pytest.raises(ValueError, match="runs on NVIDIA GPUs.*'reference'"):
    attention_kernels.cudnn_attention(q, k, v, masks.MaskSpec(ids, ids, "causal"),
                                      max_segments_per_row=4)


def test_padding_gradients_are_zero_whatever_the_kernel_leaves_there():
  """The packed kernels need not write dq/dk/dv at padding: the custom VJP zeroes them there."""
  q, k, v = _qkv(1, 6, 6, 2, 2)
  in_q = jnp.array([[True] * 4 + [False] * 2])
  in_kv = jnp.array([[True] * 5 + [False]])
  attend = lambda q, k, v, aux: q * aux + jnp.sum(k * v)  # noqa: E731 - nonzero grads everywhere.
  dq, dk, dv = jax.grad(lambda q, k, v: jnp.sum(cudnn_packed._zero_outside_segments(
      attend, q, k, v, 3.0, in_q, in_kv)), argnums=(0, 1, 2))(q, k, v)
  np.testing.assert_array_equal(dq[0, 4:], 0.0)
  np.testing.assert_array_equal(dq[0, :4], 3.0)
  np.testing.assert_array_equal(dk[0, 5:], 0.0)
  np.testing.assert_allclose(dv[0, :5], q.size * k[0, :5], rtol=1e-6)  # sum(out) = ... + |q| k.v


def _fake_cudnn(query, key, value, bias=None, mask=None, q_seqlen=None, kv_seqlen=None,
                q_offsets=None, kv_offsets=None, fp8_params=None, *, scale=1.0, mask_type=None,
                **unused):
  """JAX's internal entry point as it reads the packed layout, in XLA ops (float32)."""
  from jax._src.cudnn import fused_attention_stablehlo as fa
  assert key.shape[2] == query.shape[2], "the GQA guard repeats K/V heads on this JAX"
  assert q_offsets.shape[1] == q_seqlen.shape[1] + 1 and q_seqlen.dtype == jnp.int32
  causal = mask_type == fa.MaskType.PADDING_CAUSAL
  allowed = cudnn_packed.mask_from_layout(q_seqlen, kv_seqlen, q_offsets, kv_offsets,
                                          query.shape[1], key.shape[1], causal)
  logits = jnp.einsum("bthk,bshk->bhts", query, key, preferred_element_type=jnp.float32) * scale
  probs = jax.nn.softmax(jnp.where(allowed, logits, -1e30), axis=-1)
  return jnp.einsum("bhts,bshk->bthk", probs.astype(value.dtype), value)


def _model_batch(family):
  seg = jnp.array([[1] * 10 + [2] * 14 + [3] * 4 + [0] * 4, [1] * 20 + [2] * 12], jnp.int32)
  pos = jnp.array([list(range(10)) + list(range(14)) + list(range(4)) + [0] * 4,
                   list(range(20)) + list(range(12))], jnp.int32)
  batch = {"decoder_input_tokens": tokens((2, 32), 1) * (seg > 0), "decoder_segment_ids": seg,
           "decoder_positions": pos}
  if family == "redllm":
    eseg = jnp.array([[1] * 6 + [2] * 16 + [3] * 8 + [0] * 10, [1] * 30 + [2] * 10], jnp.int32)
    epos = jnp.array([list(range(6)) + list(range(16)) + list(range(8)) + [0] * 10,
                      list(range(30)) + list(range(10))], jnp.int32)
    batch.update(encoder_input_tokens=tokens((2, 40), 2) * (eseg > 0), encoder_segment_ids=eseg,
                 encoder_positions=epos)
  return batch


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_a_packed_model_through_the_cudnn_call_equals_the_xla_model(family, monkeypatch):
  """The whole model with attention_impl='cudnn' on packed rows (DecLLM causal; RedLLM encoder,
  decoder and cross-attention; grouped KV heads), the entry point replaced by its semantics in
  XLA ops: the lengths, offsets, mask types, scale and K/V heads the model hands cuDNN give the
  xla model's logits and gradients: in bf16 (as cuDNN needs) as close to the float32 model as
  the xla model in bf16 is (a wrong segment, offset or head moves them by their whole scale)."""
  from jax._src.cudnn import fused_attention_stablehlo as fa
  from t5like.ops.fused_attention import cudnn_packed as used
  monkeypatch.setattr(used, "entry_point", lambda: (
      _fake_cudnn, (fa.MaskType.PADDING, fa.MaskType.PADDING_CAUSAL)))
  monkeypatch.setattr(used, "check_device", lambda: None)
  batch = _model_batch(family)
  base = tiny_cfg(family, num_kv_heads=2, dtype="bfloat16")
  weights = batch["decoder_segment_ids"] > 0

  def run(cfg):
    graphdef, params = nnx.split(build_model(cfg, nnx.Rngs(0)))

    @jax.jit
    def loss(p):
      logits = nnx.merge(graphdef, p)(batch)
      return jnp.sum(jax.nn.log_softmax(logits)[..., 5] * weights), logits
    return jax.value_and_grad(loss, has_aux=True)(params)
  (_, logits_f), grads_f = run(dataclasses.replace(base, dtype="float32"))  # The reference.
  (_, logits_x), grads_x = run(base)
  (_, logits_c), grads_c = run(dataclasses.replace(base, attention_impl="cudnn",
                                                   max_segments_per_row=4))
  real = np.asarray(weights)
  flat = lambda tree: [np.asarray(x, np.float64) for x in jax.tree.leaves(tree)]  # noqa: E731
  pairs = [(logits_f[real], logits_x[real], logits_c[real])] + list(
      zip(flat(grads_f), flat(grads_x), flat(grads_c)))
  for ref, xla, cudnn in pairs:  # As close to float32 as the xla model in bf16 (or 1 %).
    ref, xla, cudnn = (np.asarray(a, np.float64) for a in (ref, xla, cudnn))
    xla_err, err = np.abs(xla - ref).max(), np.abs(cudnn - ref).max()
    assert err <= max(2 * xla_err, 1e-2 * np.abs(ref).max()), (err, xla_err)
