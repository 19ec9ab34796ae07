"""The train step's attention core on one CPU device (t5like/kernels/attention_train.cc).

Forward and gradients for q, k and v equal XLA's core (the ``xla_cpu`` backend's attention, the
``cpu_kernels`` backend's without the kernel) on the
masks the models make: packed causal DecLLM rows with padding, a PrefixLM prefix, a packed
bidirectional encoder, mixed per-head directions and RedLLM's cross-attention, with grouped kv
heads, at the array's scale on any x86 CPU. Padding queries get zeros and no gradient. The
``cpu_kernels`` backend takes the kernel exactly where it applies; under a ``dots_no_batch`` remat the backward
reads the forward's saved output instead of running the forward again.
"""
from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import tiny_cfg, tokens
from numerics import assert_close_to_scale
from t5like.kernels import attention_train, library
from t5like.models import masks
from t5like.ops.cpu_kernels import CpuKernels
from t5like.ops.xla_cpu import XlaCpu

pytestmark = pytest.mark.backends("cpu")  # XLA:CPU kernels (conftest.py).

_BACKEND = {"core": CpuKernels()}  # Whose attention core the tests call; XlaCpu(): XLA's own.

REL = 1e-5  # float32, summation order only: scores over at most 72 keys of 64 features.
# bfloat16 operands: the kernel computes in float32, XLA's core rounds the scaled queries, the
# probabilities and its products' outputs to bfloat16 (8 bits of mantissa, ~0.4 % a rounding).
BF16_REL = 2e-2


def _calls(fn, *args) -> tuple[int, int]:
  """(forward, backward) kernel calls in the compiled ``fn``."""
  text = jax.jit(fn).lower(*args).compile().as_text()
  return (text.count(f'"{library.ATTENTION_TRAIN_FWD}"'),
          text.count(f'"{library.ATTENTION_TRAIN_BWD}"'))


def _case(kind: str, b=3, t=24, h=4, g=2, d=16):
  """q, k, v, the bool mask and whether it is causal, for a mask ``kind`` of the models."""
  rng = np.random.default_rng(3)
  seg = np.zeros((b, t), np.int32)
  seg[0, :10], seg[0, 10:20] = 1, 2  # Two packed examples, then padding.
  seg[1, :] = 1
  seg[2, :7] = 1  # Mostly padding.
  s = t
  if kind == "cross":  # Decoder queries over another segment-packed encoder length.
    s = 40
    kv_seg = np.zeros((b, s), np.int32)
    kv_seg[0, :16], kv_seg[0, 16:30], kv_seg[1, :], kv_seg[2, :9] = 1, 2, 1, 1
    mask = masks.cross_attention_mask(jnp.asarray(seg), jnp.asarray(kv_seg))
  elif kind == "per_head":
    prefix = jnp.asarray(np.arange(t)[None, :] < np.array([[4], [9], [3]]))
    mask = masks.self_attention_mask(jnp.asarray(seg), kind="prefix", prefix_bt=prefix,
                                     mixed="per_head", num_heads=h)
  elif kind == "prefix":
    prefix = jnp.asarray(np.arange(t)[None, :] < np.array([[4], [9], [3]]))
    mask = masks.self_attention_mask(jnp.asarray(seg), kind="prefix", prefix_bt=prefix)
  else:
    mask = masks.self_attention_mask(jnp.asarray(seg), kind=kind)
  q = jnp.asarray(rng.standard_normal((b, t, h, d)), jnp.float32)
  k, v = (jnp.asarray(rng.standard_normal((b, s, g, d)), jnp.float32) for _ in range(2))
  return q, k, v, mask, kind == "causal"


@pytest.mark.parametrize("kind", ["causal", "prefix", "bidirectional", "per_head", "cross"])
def test_kernel_equals_the_xla_core_forward_and_gradients(kernels, kind, monkeypatch):
  q, k, v, mask, causal = _case(kind)
  cot = jnp.asarray(np.random.default_rng(4).standard_normal(q.shape), jnp.float32)

  def loss(q, k, v):  # A new function each call: the switch is read when it is traced.
    out = _BACKEND["core"].attention(q, k, v, mask, causal=causal)
    return jnp.sum(out * cot), out

  def run():
    fn = lambda *a: jax.value_and_grad(loss, (0, 1, 2), has_aux=True)(*a)  # noqa: E731
    return _calls(fn, q, k, v), jax.jit(fn)(q, k, v)

  calls, ((_, out), grads) = run()
  assert calls == (1, 1)
  monkeypatch.setitem(_BACKEND, "core", XlaCpu())
  xla_calls, ((_, want), want_grads) = run()
  assert xla_calls == (0, 0)
  assert_close_to_scale(out, want, REL, "out")
  for name, got, ref in zip(("dq", "dk", "dv"), grads, want_grads):
    assert_close_to_scale(got, ref, REL, name)
  live_q = np.asarray(jnp.any(mask, axis=(1, 3)))  # [b, t]: queries with an allowed key.
  assert not live_q.all()
  assert np.all(np.asarray(out)[~live_q] == 0) and np.all(np.asarray(grads[0])[~live_q] == 0)
  live_k = np.asarray(jnp.any(mask, axis=(1, 2)))  # [b, s]: keys some query may read.
  assert np.all(np.asarray(grads[1])[~live_k] == 0) and np.all(np.asarray(grads[2])[~live_k] == 0)


def _causal_run(t: int, d: int) -> list[np.ndarray]:
  """The kernel's causal core and its gradients at ``t`` queries and keys, head size ``d``:
  [out, dq, dk, dv]."""
  q, k, v, mask, _ = _case("causal", t=t, d=d)
  cot = jnp.asarray(np.random.default_rng(4).standard_normal(q.shape), jnp.float32)
  out, vjp = jax.vjp(lambda *a: attention_train.attend(*a, mask), q, k, v)
  return [np.asarray(x) for x in (out, *vjp(cot))]


# Run in a child (the kernels read T5LIKE_KERNELS_ISA once per process): argv t, d, output file.
_CHILD = """
import sys
import numpy as np
sys.path[:0] = sys.argv[4:]
from test_cpu_train_attention import _causal_run
np.savez(sys.argv[3], *_causal_run(int(sys.argv[1]), int(sys.argv[2])))
"""


@pytest.mark.parametrize("t,d", [(72, 64), (40, 48)])
def test_avx512_and_avx2_tiles_give_the_same_bits(kernels, t, d, tmp_path, monkeypatch):
  """tile.h's AVX-512 products (4 x 64 tiles over two full panels, 4 x 32, masked narrow panels
  and half panels: keys 72 = 32 + 32 + 8, heads of 64 or 48 = 32 + 16) sum each output in the
  AVX2 tiles' order, so the forward and gradients are the same bits as with the AVX2 tiles
  forced (``T5LIKE_KERNELS_ISA=avx2``, in a child), and equal XLA's core. On a CPU without
  AVX-512 both runs take the AVX2 tiles."""
  got = _causal_run(t, d)
  here = os.path.dirname(os.path.abspath(__file__))
  env = {**os.environ, "T5LIKE_KERNELS_ISA": "avx2"}
  subprocess.run([sys.executable, "-c", _CHILD, str(t), str(d), str(tmp_path / "avx2.npz"),
                  here, os.path.dirname(here)], env=env, check=True)
  with np.load(tmp_path / "avx2.npz") as avx2:
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, (avx2[f"arr_{i}"] for i in range(4))):
      np.testing.assert_array_equal(a, b, err_msg=name)
  q, k, v, mask, _ = _case("causal", t=t, d=d)
  cot = jnp.asarray(np.random.default_rng(4).standard_normal(q.shape), jnp.float32)
  monkeypatch.setitem(_BACKEND, "core", XlaCpu())
  want, vjp = jax.vjp(lambda *a: _BACKEND["core"].attention(*a, mask, causal=True), q, k, v)
  for name, a, b in zip(("out", "dq", "dk", "dv"), got, (want, *vjp(cot))):
    assert_close_to_scale(a, b, REL, name)


def test_callers_take_the_kernel_only_where_it_applies(kernels, monkeypatch):
  """float32 or bfloat16, head size and key lengths multiples of 8, query lengths of 4, no
  dropout, one device (a train step's 1-device mesh included), the ``cpu_kernels`` backend;
  otherwise XLA's core."""
  q, k, v, mask, _ = _case("causal")

  def uses(q, k, v, mask, **kw):
    fn = lambda q, k, v: _BACKEND["core"].attention(q, k, v, mask, **kw)  # noqa: E731
    return _calls(fn, q, k, v)[0] == 1

  assert uses(q, k, v, mask)
  assert uses(q, k, v, mask, dropout_rate=0.1)  # No rng: no dropout.
  assert not uses(q, k, v, mask, dropout_rate=0.1, rng=jax.random.key(0))
  assert uses(*(x.astype(jnp.bfloat16) for x in (q, k, v)), mask)  # Computed in float32.
  assert not uses(*(x.astype(jnp.float16) for x in (q, k, v)), mask)
  assert not uses(q[:, :22], k[:, :22], v[:, :22], mask[:, :, :22, :22])  # 22 % 4, % 8.
  assert not uses(q[..., :12], k[..., :12], v[..., :12], mask)  # head size 12
  one = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
  with jax.set_mesh(one):
    assert uses(q, k, v, mask)
  two = jax.sharding.AbstractMesh((2,), ("data",))
  with jax.sharding.use_abstract_mesh(two):  # An FFI call is not partitioned: XLA's core.
    assert not attention_train.applies(q, k, v, mask)
  from jax._src.mesh import AbstractDevice
  tpu = jax.sharding.AbstractMesh((1,), ("data",),
                                  abstract_device=AbstractDevice("TPU v5", None, "tpu"))
  with jax.sharding.use_abstract_mesh(tpu):  # A compile for a TPU topology on this host.
    assert not attention_train.applies(q, k, v, mask)
  with monkeypatch.context() as patch:  # Another default backend (a GPU host): never called.
    patch.setattr(jax, "default_backend", lambda: "gpu")
    assert not attention_train.applies(q, k, v, mask)
  monkeypatch.setitem(_BACKEND, "core", XlaCpu())
  assert not uses(q, k, v, mask)


@pytest.mark.parametrize("policy, forwards", [("dots_no_batch", 1), ("full", 2)])
def test_scanned_backward_reads_the_saved_forward(kernels, policy, forwards, monkeypatch):
  """A scanned DecLLM's loss gradient: with ``dots_no_batch`` the kernel's output and
  log-sum-exp are saved (one forward call), with ``full`` remat run again (two); the
  gradients equal XLA's core either way."""
  from flax import nnx
  from t5like.models import build_model
  batch = {"decoder_input_tokens": tokens((2, 16))}

  def model_grads(backend):
    cfg = tiny_cfg("decllm", scan_layers=True, remat_policy=policy, ops=backend)
    graphdef, params = nnx.split(build_model(cfg, nnx.Rngs(0)))

    def grads(params):
      def loss(p):
        logits = nnx.merge(graphdef, p)(batch)
        return jnp.mean(jax.nn.logsumexp(logits, -1))
      return jax.grad(loss)(params)
    return grads, params

  grads, params = model_grads("cpu_kernels")
  assert _calls(grads, params) == (forwards, 1)
  got = jax.jit(grads)(params)
  xla_grads, _ = model_grads("xla_cpu")
  want = jax.jit(xla_grads)(params)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert_close_to_scale(g, w, REL)


@pytest.mark.parametrize("kind", ["causal", "cross"])
def test_bfloat16_operands_match_the_xla_core_within_bfloat16_rounding(kernels, kind,
                                                                      monkeypatch):
  """bfloat16 q, k, v go through the float32 kernel: output and gradients in bfloat16, within
  ``BF16_REL`` of XLA's bfloat16 core."""
  q, k, v, mask, causal = (x.astype(jnp.bfloat16) if hasattr(x, "dtype") and x.dtype ==
                           jnp.float32 else x for x in _case(kind))
  cot = jnp.asarray(np.random.default_rng(4).standard_normal(q.shape), jnp.bfloat16)

  def run():
    def loss(q, k, v):
      out = _BACKEND["core"].attention(q, k, v, mask, causal=causal)
      return jnp.sum((out * cot).astype(jnp.float32)), out
    fn = lambda *a: jax.value_and_grad(loss, (0, 1, 2), has_aux=True)(*a)  # noqa: E731
    return _calls(fn, q, k, v), jax.jit(fn)(q, k, v)

  calls, ((_, out), grads) = run()
  monkeypatch.setitem(_BACKEND, "core", XlaCpu())
  xla_calls, ((_, want), want_grads) = run()
  assert calls == (1, 1) and xla_calls == (0, 0)
  assert out.dtype == jnp.bfloat16 and all(g.dtype == jnp.bfloat16 for g in grads)
  assert_close_to_scale(out, want, BF16_REL, "out")
  for name, got, ref in zip(("dq", "dk", "dv"), grads, want_grads):
    assert_close_to_scale(got, ref, BF16_REL, name)
