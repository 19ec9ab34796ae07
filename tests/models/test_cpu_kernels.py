"""The decode step's CPU kernels (t5like/kernels/): few-row products and attention over a cache.

Products are checked against float64 with the rigorous float32 bound of a K-term dot product
(``|error| <= 2 K eps sum|a||w|``), attention against a float64 softmax at the array's scale, on
any CPU; shapes exercise every row count, work-item boundaries, GQA groups, odd slot counts,
rows without a valid slot and both threads. The callers (``layers.few_row_matmul``,
``cache.attend``) must take the kernels exactly where they apply and XLA's operations
everywhere else, with the same values.
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
from t5like.inference import cache as cache_lib
from t5like.kernels import few_row, library
from t5like.models import layers

pytestmark = pytest.mark.backends("cpu")  # XLA:CPU kernels (conftest.py).

EPS32 = float(np.finfo(np.float32).eps)


def _cpu_has_avx2_fma() -> bool:
  try:
    with open("/proc/cpuinfo") as f:
      flags = set(re.search(r"^flags\s*:(.*)$", f.read(), re.M).group(1).split())
  except (OSError, AttributeError):
    return False
  return {"avx2", "fma"} <= flags


def _assert_within_dot_bound(y, a, w):
  a64, w64 = np.asarray(a, np.float64), np.asarray(w, np.float64)
  ref, bound = a64 @ w64.T, 2 * a64.shape[1] * EPS32 * (np.abs(a64) @ np.abs(w64).T)
  err = np.abs(np.asarray(y, np.float64) - ref)
  assert np.all(err <= bound + 1e-30), f"max error {err.max():.3e}, its bound {bound.max():.3e}"


def _custom_calls(fn, *args) -> int:
  text = jax.jit(fn).lower(*args).as_text()
  return text.count(library.FEW_ROW_FUSED) + text.count(library.CACHE_ATTENTION)


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
  a, w = jnp.ones((8, 64)), jnp.ones((32, 64))
  uses = _custom_calls(lambda a, w: layers.few_row_matmul(a, w, jnp.float32), a, w)
  assert uses == (1 if library.built() else 0)


@pytest.mark.parametrize("m,n,k", [(1, 1, 8), (3, 31, 64), (8, 33, 520), (8, 1000, 512),
                                   (9, 65, 136), (16, 200, 64), (5, 8192, 512)])
def test_few_row_kernel_is_a_float32_product(kernels, m, n, k):
  rng = np.random.default_rng(m * 1000 + n + k)
  a = rng.standard_normal((m, k)).astype(np.float32)
  w = (rng.standard_normal((n, k)) * rng.uniform(0.1, 10, (n, 1))).astype(np.float32)
  y = jax.jit(few_row.matmul)(a, w)
  assert y.shape == (m, n) and y.dtype == jnp.float32
  _assert_within_dot_bound(y, a, w)


def test_few_row_kernel_inside_a_program_with_concurrent_and_chained_calls(kernels):
  """Two independent products (XLA may run them at once on its two threads) feeding a third,
  and the kernel under vmap (one call per batch entry)."""
  rng = np.random.default_rng(0)
  a = rng.standard_normal((8, 512)).astype(np.float32)
  w1, w2 = (rng.standard_normal((1408, 512)).astype(np.float32) for _ in range(2))
  w3 = rng.standard_normal((64, 2816)).astype(np.float32)

  def f(a, w1, w2, w3):
    h = jnp.concatenate([few_row.matmul(a, w1), few_row.matmul(a, w2)], axis=1)
    return few_row.matmul(h, w3), h

  y, h = jax.jit(f)(a, w1, w2, w3)
  _assert_within_dot_bound(h, a, np.concatenate([w1, w2], axis=0))
  _assert_within_dot_bound(y, h, w3)
  batched = jax.jit(jax.vmap(few_row.matmul, in_axes=(0, None)))(np.stack([a, 2 * a]), w1)
  for i, scale in enumerate((1, 2)):
    _assert_within_dot_bound(batched[i], scale * a, w1)


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
  assert _custom_calls(cache_lib.attend, q, k, v, valid) == 1
  out = jax.jit(cache_lib.attend)(q, k, v, valid)
  ref = _attention_reference(q, k, v, valid)
  assert np.all(np.asarray(out)[0] == 0)
  assert_close_to_scale(out, ref)  # float32 against float64 at the output's scale.


def test_callers_take_the_kernels_only_where_they_apply(kernels, monkeypatch):
  """Float32 with K (head_dim) a multiple of 8, at most MAX_ROWS product rows, no mesh, not
  switched off: the kernels; anything else: XLA's operations. Same values either way."""
  rng = np.random.default_rng(1)

  def product(m, k, dtype=jnp.float32):
    return (jnp.asarray(rng.standard_normal((m, k)), dtype),
            jnp.asarray(rng.standard_normal((48, k)), dtype))

  def check_product(a, w, uses_kernel):
    fn = lambda a, w: layers.few_row_matmul(a, w, jnp.float32)  # noqa: E731
    assert _custom_calls(fn, a, w) == int(uses_kernel), (a.shape, a.dtype)
    # bf16 operands accumulate in float32: the same bound on their exact (bf16) values.
    _assert_within_dot_bound(jax.jit(fn)(a, w), np.asarray(a, np.float32),
                             np.asarray(w, np.float32))

  def attention(d, dtype=jnp.float32):
    q = jnp.asarray(rng.standard_normal((2, 1, 4, d)), dtype)
    k, v = (jnp.asarray(rng.standard_normal((2, 2, 9, d)), dtype) for _ in range(2))
    return q, k, v, jnp.asarray(rng.random((2, 9)) < 0.8)

  def check_attention(args, uses_kernel):
    fn = lambda *a: cache_lib.attend(*a)  # noqa: E731  (traced afresh: the switch is read then)
    assert _custom_calls(fn, *args) == int(uses_kernel)
    tol = FLOAT32_REORDER_REL if args[0].dtype == jnp.float32 else 2e-2  # bf16: 2^-8 inputs.
    assert_close_to_scale(jax.jit(fn)(*args).astype(jnp.float32), _attention_reference(*args),
                          rel=tol)

  check_product(*product(8, 64), True)
  check_product(*product(few_row.MAX_ROWS, 64), True)
  check_product(*product(few_row.MAX_ROWS + 1, 64), False)
  check_product(*product(8, 60), False)
  check_product(*product(8, 64, jnp.bfloat16), False)
  check_attention(attention(16), True)
  check_attention(attention(12), False)
  check_attention(attention(16, jnp.bfloat16), False)
  mesh = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
  with jax.set_mesh(mesh):
    check_product(*product(8, 64), False)
    check_attention(attention(16), False)
  with monkeypatch.context() as patch:  # Another default backend (a GPU host): never called.
    patch.setattr(jax, "default_backend", lambda: "gpu")
    check_attention(attention(16), False)
  monkeypatch.setenv(library.ENV_SWITCH, "0")
  check_product(*product(8, 64), False)
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
def test_prompt_attention_kernel_equals_the_training_core(kernels, mask_kind, monkeypatch):
  """The prefill's attention (``steps._prompt_attention``: each query row of a (batch, kv head)
  under its own mask row) equals ``dot_product_attention`` with GQA, left padding, prefix and
  per-head masks, as one kernel call; switched off, it is the training core itself."""
  from t5like.inference import steps
  from t5like.models.attention import dot_product_attention
  rng = np.random.default_rng(7)
  b, t, h, g, d = 3, 21, 4, 2, 16
  q = jnp.asarray(rng.standard_normal((b, t, h, d)), jnp.float32)
  k, v = (jnp.asarray(rng.standard_normal((b, t, g, d)), jnp.float32) for _ in range(2))
  mask = jnp.asarray(_prompt_masks(b, h, t)[mask_kind])
  causal = mask_kind == "causal"
  fn = lambda *a: steps._prompt_attention(*a, causal)  # noqa: E731
  want = jax.jit(lambda *a: dot_product_attention(*a, causal=causal))(q, k, v, mask)
  assert _custom_calls(fn, q, k, v, mask) == 1
  got = jax.jit(fn)(q, k, v, mask)
  assert np.all(np.asarray(got)[2, :t - 1] == 0)  # Padding queries see nothing: zeros.
  assert_close_to_scale(got, want)
  last = jax.jit(lambda *a: steps._prompt_attention(*a))(q[:, -1:], k, v, mask[:, :, -1:])
  assert_close_to_scale(last, want[:, -1:])  # The prefill's last layer: the last query only.
  monkeypatch.setenv(library.ENV_SWITCH, "0")  # A new function: traced afresh, switch read.
  assert _custom_calls(lambda *a: steps._prompt_attention(*a, causal), q, k, v, mask) == 0
