"""On an NVIDIA GPU (``make test-gpu``; marked ``gpu``, so ``make test`` leaves them out): cuDNN's
fused attention (``model.attention_impl="cudnn"``; one example per row, and packed rows through
its packed layout on Hopper or newer) equals the ``xla`` path, forward and gradients,
and the same models, compiled for the GPU, compute and generate what they do on the CPU; the
TPU-only splash kernel is a clear error.

On CPU the rest of the suite checks the cudnn call through XLA's implementation of the same
``jax.nn.dot_product_attention`` call; only here does cuDNN itself run.
"""
from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "models"))
from helpers import tiny_cfg, tokens  # noqa: E402
from numerics import assert_close_to_scale  # noqa: E402
from t5like.inference import generate  # noqa: E402
from t5like.models import build_model, masks
from t5like.ops import fused_attention as attention_kernels  # noqa: E402
from t5like.ops.reference import dot_product_attention  # noqa: E402

pytestmark = pytest.mark.gpu

# bfloat16 keeps 8 significant bits: one rounding of q, k, v or the output is up to 2^-8 of the
# value, and the two paths round in different places (cuDNN keeps scores in f32 on chip).
BF16_REL = 3e-2


@pytest.fixture(scope="module", autouse=True)
def gpu():
  if jax.default_backend() != "gpu":
    pytest.fail(f"these tests need an NVIDIA GPU with CUDA jax (`make test-gpu`); the default "
                f"backend here is {jax.default_backend()!r}")
  return jax.devices("gpu")[0]


def _qkv(t: int, s: int, dtype=jnp.bfloat16):
  """q [2, t, 8, 64], k/v [2, s, 2, 64] (grouped kv heads)."""
  r = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(r[0], (2, t, 8, 64), jnp.float32)
  k, v = jax.random.normal(r[1], (2, s, 2, 64)), jax.random.normal(r[2], (2, s, 2, 64))
  return q.astype(dtype), k.astype(dtype), v.astype(dtype)


@pytest.mark.parametrize("kind", ["causal", "bidirectional", "cross"])
def test_cudnn_attention_equals_xla_forward_and_gradients(kind):
  t, s = 256, (192 if kind == "cross" else 256)
  q, k, v = _qkv(t, s)
  q_seg = jnp.array([[1] * (t - 37) + [0] * 37, [1] * t])  # Row 0 padded at the end.
  kv_seg = jnp.array([[1] * (s - 50) + [0] * 50, [1] * s]) if kind == "cross" else q_seg
  spec = masks.MaskSpec(q_seg, kv_seg, kind)
  mask = masks.materialize(spec)
  ct = jax.random.normal(jax.random.key(1), (2, t, 8, 64))  # Cotangent of the output.

  def loss(fn, q, k, v):
    return jnp.sum(fn(q, k, v).astype(jnp.float32) * ct)

  cudnn = jax.jit(jax.value_and_grad(
      lambda q, k, v: loss(lambda *a: attention_kernels.cudnn_attention(*a, spec), q, k, v),
      argnums=(0, 1, 2)))
  ref = jax.jit(jax.value_and_grad(  # The xla path in f32 on the same bf16 inputs.
      lambda q, k, v: loss(lambda *a: dot_product_attention(*a, mask), q, k, v),
      argnums=(0, 1, 2)))
  compiled = cudnn.lower(q, k, v).compile().as_text()
  assert "cudnn" in compiled.lower(), "the cudnn implementation was not used"
  out = jax.jit(lambda q, k, v: attention_kernels.cudnn_attention(q, k, v, spec))(q, k, v)
  f32 = [x.astype(jnp.float32) for x in (q, k, v)]
  assert_close_to_scale(out, dot_product_attention(*f32, mask), BF16_REL, "output")
  assert float(jnp.abs(out[0, t - 37:]).max()) == 0.0  # Padding queries give zeros.
  (_, grads), (_, ref_grads) = cudnn(q, k, v), ref(*f32)
  for name, g, rg in zip("qkv", grads, ref_grads):
    assert_close_to_scale(g, rg, BF16_REL, f"d{name}")


# Packed rows of 256: three documents + padding; two documents; one whole row (the encoder side
# of RedLLM / cross-attention: other lengths, the same documents).
PACKED_Q = [[1] * 100 + [2] * 90 + [3] * 40 + [0] * 26, [1] * 56 + [2] * 200, [1] * 256]
PACKED_KV = [[1] * 60 + [2] * 30 + [3] * 70 + [0] * 32, [1] * 150 + [2] * 42, [1] * 192]


@pytest.mark.parametrize("kv_heads", [8, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("kind", ["causal", "bidirectional", "cross"])
def test_packed_cudnn_attention_equals_xla_forward_and_gradients(kind, kv_heads):
  """cuDNN's packed layout (segment ids -> lengths/offsets) against the xla path's segment mask
  on the same packed rows, bf16 inputs, forward and all three gradients; GQA too (on JAX <=
  0.11.0 the K/V heads are repeated first: cudnn_packed.kv_heads_for_packed)."""
  q_seg = jnp.array(PACKED_Q, jnp.int32)
  kv_seg = jnp.array(PACKED_KV, jnp.int32) if kind == "cross" else q_seg
  t, s = q_seg.shape[1], kv_seg.shape[1]
  r = jax.random.split(jax.random.key(2), 4)
  q = jax.random.normal(r[0], (3, t, 8, 64)).astype(jnp.bfloat16)
  k = jax.random.normal(r[1], (3, s, kv_heads, 64)).astype(jnp.bfloat16)
  v = jax.random.normal(r[2], (3, s, kv_heads, 64)).astype(jnp.bfloat16)
  ct = jax.random.normal(r[3], (3, t, 8, 64))
  spec = masks.MaskSpec(q_seg, kv_seg, kind)
  mask = masks.materialize(spec)

  def grads(fn, *args):
    return jax.jit(jax.value_and_grad(
        lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) * ct), argnums=(0, 1, 2)))(*args)
  packed = lambda q, k, v: attention_kernels.cudnn_attention(  # noqa: E731
      q, k, v, spec, max_segments_per_row=4)
  hlo = jax.jit(packed).lower(q, k, v).compile().as_text().lower()
  assert "cudnn" in hlo, "the cudnn implementation was not used"
  f32 = [x.astype(jnp.float32) for x in (q, k, v)]
  out = jax.jit(packed)(q, k, v)
  assert_close_to_scale(out, dot_product_attention(*f32, mask), BF16_REL, "output")
  assert float(jnp.abs(out[0, 230:]).max()) == 0.0  # Padding queries give zeros.
  (_, g), (_, ref) = grads(packed, q, k, v), grads(
      lambda q, k, v: dot_product_attention(q, k, v, mask), *f32)
  for name, a, b in zip("qkv", g, ref):
    assert_close_to_scale(a, b, BF16_REL, f"d{name}")


def _packed_batch(family: str) -> dict:
  """Two packed rows (three and two documents, padding) as seqio makes them."""
  seg = jnp.array([[1] * 20 + [2] * 24 + [3] * 12 + [0] * 8, [1] * 30 + [2] * 34], jnp.int32)
  batch = {"decoder_input_tokens": tokens((2, 64), 1) * (seg > 0), "decoder_segment_ids": seg,
           "decoder_target_tokens": tokens((2, 64), 2) * (seg > 0)}
  if family == "redllm":
    eseg = jnp.array([[1] * 16 + [2] * 30 + [3] * 10 + [0] * 8, [1] * 40 + [2] * 24], jnp.int32)
    batch.update(encoder_input_tokens=tokens((2, 64), 3) * (eseg > 0), encoder_segment_ids=eseg)
  return batch


def _unpacked_batch(family: str) -> dict:
  """Two rows, one example each, the first padded (what attention_impl='cudnn' trains on)."""
  seg = jnp.array([[1] * 40 + [0] * 24, [1] * 64], jnp.int32)
  batch = {"decoder_input_tokens": tokens((2, 64), 1) * seg, "decoder_segment_ids": seg,
           "decoder_target_tokens": tokens((2, 64), 2) * seg}
  if family == "redllm":
    eseg = jnp.array([[1] * 50 + [0] * 14, [1] * 64], jnp.int32)
    batch.update(encoder_input_tokens=tokens((2, 64), 3) * eseg, encoder_segment_ids=eseg)
  return batch


def _loss_and_grads(model, batch):
  def loss_fn(m):
    logits = m(batch).astype(jnp.float32)
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), batch["decoder_target_tokens"][..., None],
                               axis=-1)[..., 0]
    w = batch["decoder_segment_ids"] > 0
    return jnp.sum(nll * w) / jnp.sum(w)
  return nnx.jit(nnx.value_and_grad(loss_fn))(model)


@pytest.mark.parametrize("rows", ["unpacked", "packed"])
@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_cudnn_model_is_as_close_to_float32_as_the_xla_model(family, rows):
  """The same weights in bf16 through attention_impl 'cudnn' and 'reference', each against the f32
  model: cuDNN's loss and gradients are as close to f32 as XLA's bf16 path is (a small gradient
  such as a norm scale's sums many rounded terms, so bf16 alone can move it by a few %; a wrong
  mask or length moves it by its whole scale)."""
  kw = dict(num_kv_heads=2, head_dim=16, num_heads=4, d_model=64)
  batch = _unpacked_batch(family) if rows == "unpacked" else _packed_batch(family)
  slots = 1 if rows == "unpacked" else 4  # The plain cuDNN call, or its packed layout.
  runs = {name: _loss_and_grads(build_model(tiny_cfg(family, **kw, **over), nnx.Rngs(0)), batch)
          for name, over in (("f32", dict(dtype="float32")),
                             ("xla", dict(dtype="bfloat16", attention_impl="reference")),
                             ("cudnn", dict(dtype="bfloat16", attention_impl="cudnn",
                                            max_segments_per_row=slots)))}
  (f32_loss, f32_grads), (xla_loss, xla_grads), (loss, grads) = runs.values()
  assert abs(float(loss) - float(f32_loss)) <= max(
      2 * abs(float(xla_loss) - float(f32_loss)), 1e-2 * abs(float(f32_loss)))
  ref = jax.tree.leaves(nnx.to_pure_dict(f32_grads))
  xla = jax.tree.leaves(nnx.to_pure_dict(xla_grads))
  for (path, g), r, x in zip(jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(grads))[0],
                             ref, xla):
    r, x, g = (np.asarray(a, np.float64) for a in (r, x, g))
    scale, xla_err, err = np.abs(r).max(), np.abs(x - r).max(), np.abs(g - r).max()
    assert err <= max(2 * xla_err, 1e-2 * scale), (
        f"{jax.tree_util.keystr(path)}: cudnn error {err:.2e}, xla bf16 error {xla_err:.2e}, "
        f"scale {scale:.2e}")


def _on(device, fn):
  with jax.default_device(device), jax.default_matmul_precision("highest"):
    return jax.tree.map(np.asarray, fn())


@pytest.mark.parametrize("family, kw", [("decllm", dict(decoder_attention="prefix", num_kv_heads=2)),
                                        ("redllm", dict())])
def test_gpu_forward_and_gradients_equal_cpu(gpu, family, kw):
  """f32, full-precision matmuls (no TF32): the GPU computes what the CPU computes."""
  batch = _unpacked_batch(family)
  if family == "decllm":
    batch["decoder_causal_attention"] = jnp.array([[1] * 10 + [0] * 54, [1] * 30 + [0] * 34])

  def run():
    model = build_model(tiny_cfg(family, **kw), nnx.Rngs(0))
    logits = nnx.jit(lambda m, b: m(b))(model, batch)
    return logits, nnx.to_pure_dict(_loss_and_grads(model, batch)[1])
  cpu_logits, cpu_grads = _on(jax.devices("cpu")[0], run)
  gpu_logits, gpu_grads = _on(gpu, run)
  assert_close_to_scale(gpu_logits, cpu_logits, err_msg="logits")
  for (path, g), r in zip(jax.tree_util.tree_flatten_with_path(gpu_grads)[0],
                          jax.tree.leaves(cpu_grads)):
    assert_close_to_scale(g, r, 1e-4, jax.tree_util.keystr(path))


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_gpu_greedy_generation_equals_cpu(gpu, family):
  prompts = [[5, 6, 7], list(range(8, 40)), [30]]

  def run():
    model = build_model(tiny_cfg(family, num_kv_heads=2), nnx.Rngs(3))
    return np.asarray(generate(model, prompts, max_new_tokens=12, eos_id=-1), np.int32)
  np.testing.assert_array_equal(_on(gpu, run), _on(jax.devices("cpu")[0], run))


def test_splash_on_a_gpu_is_a_clear_error():
  q, k, v = _qkv(128, 128)
  spec = masks.MaskSpec(jnp.ones((2, 128), jnp.int32), jnp.ones((2, 128), jnp.int32), "causal")
  with pytest.raises(ValueError, match="TPU kernel.*cudnn"):
    attention_kernels.splash_attention(q, k, v, spec)
