"""Small shared helpers: parameters with logical axes, activation constraints, dropout, dtypes."""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import nnx

from t5like.kernels import few_row

Axes = tuple[str | None, ...]


def dtype(name: str) -> jnp.dtype:
  return jnp.dtype(name)


def param(rngs: nnx.Rngs, init: Callable, shape: Sequence[int], axes: Axes,
          param_dtype: str) -> nnx.Param:
  """A parameter tagged with logical axis names (mapped to the mesh by t5like.partitioning).

  Eager sharding is off: the trainer builds the state abstractly and lets `jax.jit` place it.
  """
  assert len(axes) == len(shape), (shape, axes)
  value = init(rngs.params(), tuple(shape), dtype(param_dtype))
  return nnx.Param(value, out_sharding=tuple(axes), eager_sharding=False)


def constrain(x: jax.Array, axes: Axes) -> jax.Array:
  """Logical sharding constraint on an activation; a no-op outside a mesh + rules context."""
  return nn.with_logical_constraint(x, axes)


def platform() -> str:
  """The platform the computation being traced runs on: the mesh's devices (a TPU slice in an
  ahead-of-time compile on a CPU host), else the default backend ("cpu", "gpu", "tpu")."""
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty:
    return mesh.abstract_device.platform
  return jax.default_backend()


def on_cpu() -> bool:
  """Whether the computation being traced runs on CPU devices (see `platform`)."""
  return platform() == "cpu"


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TransposedKernel:
  """A kernel ``w [*contract, *out]`` stored as the 2-D ``[prod(out), prod(contract)]``, which
  ``project`` contracts on its last axis as the streamed operand (``few_row_matmul``).

  The decode step's layout on XLA:CPU, made once per ``generate`` call: its weight products
  have one row per sequence and read every weight once per token, and XLA:CPU streams a
  row-major ``[N, K]`` left operand faster than ``[K, N]`` (the small DecLLM's decode step
  ~1.35x faster at 8 rows, ``benchmarks/decode_layout.py``).
  """
  w_nk: jax.Array  # [prod(out), prod(contract)].
  shape: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))  # [*contract, *out].
  n_contract: int = dataclasses.field(metadata=dict(static=True))  # len(contract).

  def astype(self, dt) -> "TransposedKernel":
    return dataclasses.replace(self, w_nk=self.w_nk.astype(dt))


def transpose_kernel(w: jax.Array, n_contract: int) -> TransposedKernel:
  """``w [*contract, *out]`` (its first ``n_contract`` axes contracted) as a TransposedKernel."""
  k = math.prod(w.shape[:n_contract])
  return TransposedKernel(w.reshape(k, -1).T, tuple(w.shape), n_contract)


def kernel(var: nnx.Variable, dt) -> jax.Array | TransposedKernel:
  """A kernel parameter's value in the compute dtype, for ``project`` (either layout)."""
  return var.get_value().astype(dt)


def project(x: jax.Array, w: jax.Array | TransposedKernel, n_contract: int = 1) -> jax.Array:
  """``x [..., *c] @ w [*c, *o] -> [..., *o]`` (the last ``n_contract`` axes of ``x`` against the
  first of ``w``) as one 2-D matmul ``[N, K] x [K, M]``.

  Same contraction as the einsum, written so XLA:CPU takes its fast matmul path forward and
  backward: with [batch, length, ...] operands the weight gradient contracts over two axes and
  the SwiGLU MLP ran ~1.7x slower (``benchmarks/step_breakdown.py``). The reshapes merge the
  major axes only, so sharded batch/heads axes stay sharded. A ``TransposedKernel`` (the decode
  step's weights) is the same contraction against the stored ``[M, K]``.
  """
  shape = w.shape
  lead, contract, out = x.shape[:x.ndim - n_contract], x.shape[x.ndim - n_contract:], \
      shape[n_contract:]
  k = math.prod(contract)
  assert tuple(shape[:n_contract]) == tuple(contract), (x.shape, shape)
  if isinstance(w, TransposedKernel):
    assert w.n_contract == n_contract, (w.n_contract, n_contract)
    y = few_row_matmul(x.reshape(-1, k), w.w_nk, x.dtype)
  else:
    y = matmul_2d(x.reshape(-1, k), w.reshape(k, -1), 0, x.dtype)
  return y.reshape(*lead, *out)


def matmul_2d(a: jax.Array, b: jax.Array, b_contract: int, out_dtype) -> jax.Array:
  """``a [M, K]`` times ``b [K, N]`` (``b_contract=0``) or ``b [N, K]`` (``1``) -> ``[M, N]``.

  On CPU, low-precision operands go through ``_cpu_lowp_matmul`` and float32 ``a b^T`` through
  ``_cpu_nt_matmul``; everything else is one ``dot_general`` (accumulating in float32 for low
  precision)."""
  low = a.dtype in (jnp.bfloat16, jnp.float16)
  if low and on_cpu():
    return _cpu_lowp_matmul(a, b, b_contract, jnp.dtype(out_dtype))
  if b_contract == 1 and on_cpu():  # float32 ``a b^T``: the logits over the embedding table.
    return _cpu_nt_matmul(a, b).astype(out_dtype)
  acc = jnp.float32 if low else None
  y = jax.lax.dot_general(a, b, (((1,), (b_contract,)), ((), ())), preferred_element_type=acc)
  return y.astype(out_dtype)


def few_row_matmul(a_mk: jax.Array, b_nk: jax.Array, out_dtype) -> jax.Array:
  """``a [M, K] b [N, K]^T -> [M, N]`` for a few rows M (the decode step's products).

  Computed as ``b a^T -> [N, M]``, the weight as the streamed left operand (on XLA:CPU
  1.2-1.4x faster than ``a b^T`` at M = 2..32 and equal at M = 1; ~1.8x when the weight fits in
  cache), then the small result transposed after an optimization barrier: without it XLA folds
  the transpose back into the dot, which then runs as ``a b^T``. Float32 products of up to 16
  rows on one CPU device run on ``t5like.kernels.few_row`` where it is built (~1.4x faster).
  """
  if few_row.applies(a_mk, b_nk):
    return few_row.matmul(a_mk, b_nk).astype(out_dtype)
  acc = jnp.float32 if a_mk.dtype in (jnp.bfloat16, jnp.float16) else None
  y_nm = jax.lax.dot_general(b_nk, a_mk, (((1,), (1,)), ((), ())), preferred_element_type=acc)
  return jax.lax.optimization_barrier(y_nm).T.astype(out_dtype)


def _dot(a, b, ca, cb):
  return jax.lax.dot_general(a, b, (((ca,), (cb,)), ((), ())), preferred_element_type=jnp.float32)


def _dot_same(a, b, ca, cb):
  return jax.lax.dot_general(a, b, (((ca,), (cb,)), ((), ())))


def _transposed(a: jax.Array) -> jax.Array:
  """``a.T`` materialised row-major (a plain transpose is folded into the dot as a layout, which
  XLA:CPU's bf16 matmul then runs on its slow path)."""
  m, n = a.shape
  return jax.lax.optimization_barrier(a.reshape(m, n, 1).transpose(1, 0, 2).reshape(n, m))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _cpu_lowp_matmul(a, b, b_contract, out_dtype):
  """bf16/f16 matmul for XLA:CPU, whose fast low-precision path (AMX / AVX512-BF16: 0.5-1.3
  TFLOP/s on this project's machines against ~0.2 for float32) needs low-precision operands,
  float32 accumulation and a row-major left operand contracted on its last axis, in the backward
  pass too; the default gradients of a dot miss it on every count (~0.15 TFLOP/s)."""
  return _dot(a, b, 1, b_contract).astype(out_dtype)


def _lowp_fwd(a, b, b_contract, out_dtype):
  return _cpu_lowp_matmul(a, b, b_contract, out_dtype), (a, b)


def _lowp_bwd(b_contract, out_dtype, res, g_mn):
  a_mk, b = res
  g_mn = g_mn.astype(a_mk.dtype)
  da = _dot(g_mn, b, 1, 1 - b_contract).astype(a_mk.dtype)
  # The weight gradient with only its left operand transposed (row-major, contracted on its
  # last axis; the right one contracted on its first, as a forward weight is): the same values
  # as transposing both, one [rows, features] copy fewer (products 1.06x alone on a Zen 4).
  # b [N, K] (the logits' table): db = (a^T g)^T, transposing a and the [K, N] result rather
  # than g [M, N] (33 MB at a vocabulary of 8,192): 1.15x alone on a Zen 4.
  atg_kn = _dot(_transposed(a_mk), g_mn, 1, 0)
  db = atg_kn if b_contract == 0 else _transposed(atg_kn)
  return da, db.astype(b.dtype)


_cpu_lowp_matmul.defvjp(_lowp_fwd, _lowp_bwd)


@jax.custom_vjp
def _cpu_nt_matmul(a_mk, b_nk):
  """float32 ``a [M, K] b [N, K]^T`` for XLA:CPU (the logits against the ``[vocab, embed]``
  table), whose gradient for ``b`` is computed as ``(a^T g)^T`` with both transposes
  materialised: XLA:CPU runs the default ``g^T a`` (both operands contracted on their first
  axis) at 40-50 GFLOP/s when K = 128 and N = 8,192, this form at 80-100 (2x; 1.35x at K = 512).
  Results keep the operands' dtype (float64 under x64 stays float64)."""
  return _dot_same(a_mk, b_nk, 1, 1)


def _nt_fwd(a_mk, b_nk):
  return _cpu_nt_matmul(a_mk, b_nk), (a_mk, b_nk)


def _nt_bwd(res, g_mn):
  a_mk, b_nk = res
  da_mk = _dot_same(g_mn, b_nk, 1, 0)
  db_nk = _transposed(_dot_same(_transposed(a_mk), g_mn, 1, 0))
  return da_mk.astype(a_mk.dtype), db_nk.astype(b_nk.dtype)


_cpu_nt_matmul.defvjp(_nt_fwd, _nt_bwd)


def dropout(x: jax.Array, rate: float, rng: jax.Array | None) -> jax.Array:
  """Inverted dropout; identity when ``rng`` is None (deterministic) or ``rate`` is 0.

  An element is kept with probability q = round(2^16 (1 - rate)) / 2^16 (the rate to 16 bits)
  and scaled by 1/q, so the output's expectation is ``x``. The draw compares two random bytes
  per element with the two bytes of q (high byte below, or equal and low byte below) instead of
  ``jax.random.bernoulli`` (32 random bits, converted to f32 uniforms): XLA:TPU kept several
  [batch, heads, q, kv] u32/f32 buffers of the latter alive per attention layer —
  decllm_150m_flan on v5e-256 peaked at 13.3 GiB per chip with dropout 0.05 vs 1.9 GiB with this
  draw (1.5 GiB without dropout), measured with ``train.py --compile_only``.
  """
  if rng is None or rate == 0.0:
    return x
  q = min(max(round(65536 * (1.0 - rate)), 1), 65535)  # Keep probability in units of 2^-16.
  hi, lo = divmod(q, 256)
  bytes_2x = jax.random.bits(rng, (2,) + x.shape, jnp.uint8)
  keep = (bytes_2x[0] < hi) | ((bytes_2x[0] == hi) & (bytes_2x[1] < lo))
  return jnp.where(keep, x * jnp.asarray(65536.0 / q, x.dtype), jnp.zeros_like(x))


def fold(rng: jax.Array | None, *data: int | jax.Array) -> jax.Array | None:
  """Derives an independent key per (layer, site); passes None through."""
  if rng is None:
    return None
  for d in data:
    rng = jax.random.fold_in(rng, d)
  return rng


def fan_in_init(fan_in: int) -> Callable:
  """Normal init with std 1/sqrt(fan_in), the T5X/MaxText default for dense kernels."""
  return nnx.initializers.normal(stddev=fan_in ** -0.5)
