"""The QKV norms + RoPE of attention on one CPU device (t5like/kernels/head_norm.cc).

Forward and gradients (x and the norm's scale) equal the ``xla_cpu`` backend's ``norm_rope``
(RMSNorm then RoPE) at the array's scale, float32 and bfloat16 projections, with and without
the rotation, at arbitrary (RedLLM's continuous) positions; the layers take the kernel exactly
where it applies, and whole DecLLM / RedLLM losses and gradients on the ``cpu_kernels``
backend equal those on ``xla_cpu``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import tiny_cfg, tokens
from numerics import assert_close_to_scale
from t5like.kernels import head_norm, library
from t5like.models import rotary
from t5like.ops.xla_cpu import XlaCpu

pytestmark = pytest.mark.backends("cpu")  # XLA:CPU kernels (conftest.py).

REL = 1e-5  # float32: summation order only (32 features; d scale over 768 rows).
EPS = 1e-6


def _case(dtype, d=32, rope=True):
  rng = np.random.default_rng(5)
  # 3 x 64 x 4 = 768 head vectors: three of the kernel's 256-row work items.
  x = jnp.asarray(rng.standard_normal((3, 64, 4, d)) * 3.0, dtype)
  scale = jnp.asarray(rng.standard_normal(d), jnp.float32)
  positions = jnp.asarray(rng.integers(0, 300, (3, 64)))  # Any offsets (continuous positions).
  rot = rotary.as_rotary(positions, d, 10_000.0) if rope else None
  cot = jnp.asarray(rng.standard_normal(x.shape), jnp.float32)
  return x, scale, rot, cot


def _xla(x, scale, rot):
  return XlaCpu().norm_rope(x.astype(jnp.float32), scale, rot, EPS)


def _kernel(x, scale, rot):
  return head_norm.norm_rope(x, scale, rot, EPS)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("rope", [True, False])
def test_kernel_equals_xla_norm_and_rope(kernels, dtype, rope):
  x, scale, rot, cot = _case(dtype, rope=rope)
  assert head_norm.applies(x, rot)
  results = {}
  for name, fn in (("kernel", _kernel), ("xla", _xla)):
    out, vjp = jax.vjp(jax.jit(lambda x, s, f=fn: f(x, s, rot)), x, scale)
    results[name] = (out, *vjp(cot))
  (out, dx, dscale), (want, want_dx, want_dscale) = results["kernel"], results["xla"]
  assert out.dtype == jnp.float32 and dx.dtype == dtype
  assert_close_to_scale(out, want, REL, "y")
  # bfloat16 d x: both round the same float32 value; a last-bit tie may differ (2^-8).
  assert_close_to_scale(dx, want_dx, REL if dtype == jnp.float32 else 2 ** -8, "dx")
  assert_close_to_scale(dscale, want_dscale, REL, "d scale")


def test_applies_only_to_what_the_kernel_serves(kernels):
  x, _, rot, _ = _case(jnp.float32)
  assert head_norm.applies(x, rot) and head_norm.applies(x.astype(jnp.bfloat16), None)
  assert not head_norm.applies(x.astype(jnp.float16), rot)
  assert not head_norm.applies(x[..., :8], None)  # head_dim % 16
  narrow = rotary.Rotary(rot.sin[:1], rot.cos[:1])  # A table broadcast over the batch.
  assert not head_norm.applies(x, narrow)


def test_a_wrong_table_is_a_clear_error(kernels):
  x, scale, rot, _ = _case(jnp.float32)
  sin = jnp.zeros((5, 16), jnp.float32)  # 5 positions do not divide 768 rows.
  with pytest.raises(Exception, match="head_norm wants"):
    jax.block_until_ready(head_norm._norm_rope(x, scale, sin, sin, EPS))


def _calls(fn, *args) -> int:
  text = jax.jit(fn).lower(*args).compile().as_text()
  return text.count(f'"{library.HEAD_NORM_FWD}"') + text.count(f'"{library.HEAD_NORM_BWD}"')


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_models_are_unchanged_by_the_kernel(kernels, family):
  """Loss and every gradient of a whole model (head_dim 16, so the kernel applies; RedLLM's
  cross-attention rotates decoder queries at continuous positions) equal XLA's layers."""
  from flax import nnx
  from t5like.models import build_model
  if family == "decllm":
    batch = {"decoder_input_tokens": tokens((2, 16))}
  else:
    batch = {"encoder_input_tokens": tokens((2, 8)), "decoder_input_tokens": tokens((2, 8), 1)}

  def run(backend):
    cfg = tiny_cfg(family, head_dim=16, scan_layers=False, ops=backend)
    graphdef, params = nnx.split(build_model(cfg, nnx.Rngs(0)))

    def loss(p):
      return jnp.mean(jax.nn.logsumexp(nnx.merge(graphdef, p)(batch).astype(jnp.float32), -1))
    fn = jax.value_and_grad(loss)
    return _calls(fn, params), jax.jit(fn)(params)

  # Forward and backward of q, k and v in every attention layer.
  layers = 2 if family == "decllm" else 2 + 2 * 2
  calls, (got_loss, got) = run("cpu_kernels")
  xla_calls, (want_loss, want) = run("xla_cpu")
  assert calls == 2 * 3 * layers and xla_calls == 0
  assert_close_to_scale(got_loss, want_loss, REL, "loss")
  for (path, g), w in zip(jax.tree.leaves_with_path(got), jax.tree.leaves(want)):
    assert_close_to_scale(g, w, REL, jax.tree_util.keystr(path))
