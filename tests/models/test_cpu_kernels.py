"""The few-row attention kernel (t5like/kernels/cache_attention: a decode step's token over its
cache, a prompt under its mask) behind the ``cpu_kernels`` backend's attention core.

Attention is checked against a float64 softmax at the array's scale, on any CPU; shapes exercise
GQA groups, odd slot counts, rows without a valid slot and both threads. The backend must take
the kernel exactly where it applies and XLA's operations everywhere else, with the same values.
"""
from __future__ import annotations

import importlib.metadata
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numerics import FLOAT32_REORDER_REL, assert_close_to_scale
from t5like.kernels import library
from t5like.ops import reference
from t5like.ops.cpu_kernels import CpuKernels
from t5like.ops.xla_cpu import XlaCpu

CPU = CpuKernels()

pytestmark = pytest.mark.backends("cpu")  # XLA:CPU kernels (conftest.py).



def _cpu_has_avx2_fma() -> bool:
  try:
    with open("/proc/cpuinfo") as f:
      flags = set(re.search(r"^flags\s*:(.*)$", f.read(), re.M).group(1).split())
  except (OSError, AttributeError):
    return False
  return {"avx2", "fma"} <= flags


def _custom_calls(fn, *args) -> int:
  text = jax.jit(fn).lower(*args).as_text()
  return text.count(library.CACHE_ATTENTION)


def _installed() -> bool:
  """Whether t5like was installed (setup.py ran), not only imported from a source tree."""
  try:
    importlib.metadata.distribution("t5like")
  except importlib.metadata.PackageNotFoundError:
    return False
  return True


def test_the_kernels_are_built_where_they_can_be():
  """An install on an x86 CPU with AVX2 + FMA and a C++ compiler must give usable kernels;
  elsewhere (or from a source tree never installed) the package works without them."""
  compiler = any(shutil.which(c) for c in ("c++", "g++", "clang++"))
  if compiler and _cpu_has_avx2_fma() and _installed():
    assert library.built(), ("setup.py should have built t5like/kernels/_cpu (a C++ compiler "
                             "and AVX2 are here); reinstall: pip install -e .")
  q, kv, valid = jnp.ones((2, 1, 4, 64)), jnp.ones((2, 2, 9, 64)), jnp.ones((2, 9), bool)
  assert _custom_calls(_cache_attend, q, kv, kv, valid) == (1 if library.built() else 0)


def _cache_attend(q_b1hk, k_bgsk, v_bgsk, valid_bs, backend=CPU):
  """The backend's attention core of one token per row over a cache [b, g, slots, d]."""
  return backend.attention(q_b1hk, jnp.swapaxes(k_bgsk, 1, 2), jnp.swapaxes(v_bgsk, 1, 2),
                           valid_bs[:, None, None, :])


def _attention_reference(q_b1hk, k_bgsk, v_bgsk, valid_bs):
  """float64 softmax attention over the valid slots; zeros for a row without one."""
  q, k, v = (np.asarray(x, np.float64) for x in (q_b1hk, k_bgsk, v_bgsk))
  b, _, h, d = q.shape
  g = k.shape[1]
  q = q.reshape(b, g, h // g, d) * d ** -0.5
  scores = np.einsum("bgrd,bgsd->bgrs", q, k)
  valid = np.asarray(valid_bs)[:, None, None, :]
  scores = np.where(valid, scores, -np.inf)
  peak = np.max(scores, axis=-1, keepdims=True)
  e = np.where(valid, np.exp(scores - np.where(np.isfinite(peak), peak, 0.0)), 0.0)
  total = e.sum(-1, keepdims=True)
  probs = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
  return np.einsum("bgrs,bgsd->bgrd", probs, v).reshape(b, 1, h, d)


@pytest.mark.parametrize("b,g,r,s,d,q_scale", [
    (3, 2, 4, 37, 64, 3), (8, 8, 1, 208, 64, 3), (2, 1, 2, 5, 24, 3), (1, 4, 1, 1, 128, 3),
    (4, 2, 1, 61, 32, 60)])  # Scores ~60 apart: exponentials below float32's range are zeros.
def test_cache_attention_kernel_equals_a_float64_softmax(kernels, b, g, r, s, d, q_scale):
  rng = np.random.default_rng(b * g * r * s * d)
  q = rng.standard_normal((b, 1, g * r, d)).astype(np.float32) * q_scale
  k, v = (rng.standard_normal((b, g, s, d)).astype(np.float32) for _ in range(2))
  valid = rng.random((b, s)) < 0.7
  valid[0] = False  # A row with no valid slot: zeros.
  if b > 1:
    valid[-1] = True
  assert _custom_calls(_cache_attend, q, k, v, valid) == 1
  out = jax.jit(_cache_attend)(q, k, v, valid)
  ref = _attention_reference(q, k, v, valid)
  assert np.all(np.asarray(out)[0] == 0)
  assert_close_to_scale(out, ref)  # float32 against float64 at the output's scale.


def test_the_backend_takes_the_kernel_only_where_it_applies(kernels, monkeypatch):
  """Float32 with head_dim a multiple of 8, no mesh, no dropout: the kernel; anything else (and
  the ``xla_cpu`` backend always): XLA's operations. Same values either way."""
  rng = np.random.default_rng(1)

  def attention(d, dtype=jnp.float32):
    q = jnp.asarray(rng.standard_normal((2, 1, 4, d)), dtype)
    k, v = (jnp.asarray(rng.standard_normal((2, 2, 9, d)), dtype) for _ in range(2))
    return q, k, v, jnp.asarray(rng.random((2, 9)) < 0.8)

  def check_attention(args, uses_kernel, backend=CPU):
    fn = lambda *a: _cache_attend(*a, backend=backend)  # noqa: E731
    assert _custom_calls(fn, *args) == int(uses_kernel)
    tol = FLOAT32_REORDER_REL if args[0].dtype == jnp.float32 else 2e-2  # bf16: 2^-8 inputs.
    assert_close_to_scale(jax.jit(fn)(*args).astype(jnp.float32), _attention_reference(*args),
                          rel=tol)

  check_attention(attention(16), True)
  check_attention(attention(12), False)
  check_attention(attention(16, jnp.bfloat16), False)
  check_attention(attention(16), False, XlaCpu())
  mesh = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
  with jax.set_mesh(mesh):
    check_attention(attention(16), False)
  with monkeypatch.context() as patch:  # Another default backend (a GPU host): never called.
    patch.setattr(jax, "default_backend", lambda: "gpu")
    check_attention(attention(16), False)


def _prompt_masks(b, h, t):
  """[batch, heads|1, t, t] masks of a prefill: causal over left-padded rows (the padding's
  query rows see nothing), bidirectional over a prefix, and per head (mixed directions)."""
  pad = np.arange(t)[None, :] >= np.array([0, 3, t - 1])[:b, None]  # [b, t] real tokens.
  causal = np.tril(np.ones((t, t), bool))[None] & pad[:, None, :] & pad[:, :, None]
  prefix = causal | (pad[:, None, :] & pad[:, :, None] & (np.arange(t) < 5)[None, None, :])
  per_head = np.stack([causal if i % 2 else prefix for i in range(h)], axis=1)
  return {"causal": causal[:, None], "prefix": prefix[:, None], "per_head": per_head}


@pytest.mark.parametrize("mask_kind", ["causal", "prefix", "per_head"])
def test_prompt_attention_kernel_equals_the_reference_core(kernels, mask_kind):
  """A prompt's attention (each query row of a (batch, kv head) under its own mask row) equals
  the reference core with GQA, left padding, prefix and per-head masks, as one kernel call, and
  so do its gradients (the reference form's)."""
  rng = np.random.default_rng(7)
  b, t, h, g, d = 3, 21, 4, 2, 16
  q = jnp.asarray(rng.standard_normal((b, t, h, d)), jnp.float32)
  k, v = (jnp.asarray(rng.standard_normal((b, t, g, d)), jnp.float32) for _ in range(2))
  mask = jnp.asarray(_prompt_masks(b, h, t)[mask_kind])
  causal = mask_kind == "causal"
  fn = lambda *a: CPU.attention(*a, causal=causal)  # noqa: E731
  want = jax.jit(lambda *a: reference.Reference().attention(*a))(q, k, v, mask)
  assert _custom_calls(fn, q, k, v, mask) == 1
  got = jax.jit(fn)(q, k, v, mask)
  assert np.all(np.asarray(got)[2, :t - 1] == 0)  # Padding queries see nothing: zeros.
  assert_close_to_scale(got, want)
  cot = jnp.asarray(rng.standard_normal(got.shape), jnp.float32)
  grads = jax.grad(lambda *a: jnp.sum(fn(*a, mask) * cot), (0, 1, 2))(q, k, v)
  want_grads = jax.grad(lambda *a: jnp.sum(reference.Reference().attention(*a, mask) * cot),
                        (0, 1, 2))(q, k, v)
  for g, w in zip(grads, want_grads):
    assert_close_to_scale(g, w)
