"""The ``xla_cpu`` backend: the ``xla`` forms plus what XLA:CPU needs to take its fast paths.

- Low-precision (bf16/f16) products through ``_lowp_matmul``: XLA:CPU's fast low-precision path
  (AMX / AVX512-BF16, 0.5-1.3 TFLOP/s against ~0.2 for float32) needs low-precision operands,
  float32 accumulation and a row-major left operand contracted on its last axis, in the
  backward pass too; the default gradients of a dot miss it on every count.
- The float32 logits ``a b^T`` through ``_nt_matmul``, whose table gradient is ``(a^T g)^T``
  with both transposes materialised (2x faster than XLA:CPU's default at K = 128).
- The RoPE table behind a conditional: XLA:CPU drops optimization barriers before it fuses, so
  unrolled layers recomputed sin/cos per head and layer (5.3 ms against 0.4 per rotation of
  [8, 256, 8, 64]); a conditional is opaque to fusion, both branches are the rotation.
- Causal self-attention in query blocks, each attending only the keys up to its own last row
  (1.3-2x at 256-2,048 tokens on XLA:CPU; at most ``CAUSAL_MAX_BLOCKS`` blocks, longer blocks
  past that).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from t5like.ops.reference import Rotary, fold, rotation
from t5like.ops.xla import Xla, _attend, _low

CAUSAL_BLOCK = 128  # Fewest query rows per block of a causal mask,
CAUSAL_MAX_BLOCKS = 8  # and most blocks.


@dataclasses.dataclass(frozen=True)
class XlaCpu(Xla):
  name = "xla_cpu"

  def matmul(self, a_mk, b, b_contract, out_dtype):
    if _low(a_mk.dtype):
      return _lowp_matmul(a_mk, b, b_contract, jnp.dtype(out_dtype))
    if b_contract == 1:
      return _nt_matmul(a_mk, b).astype(out_dtype)
    return super().matmul(a_mk, b, b_contract, out_dtype)

  def rotary_table(self, positions_bt, head_dim, max_wavelength):
    if positions_bt.size == 0:
      return super().rotary_table(positions_bt, head_dim, max_wavelength)
    rot = lambda p: tuple(rotation(p, head_dim, max_wavelength))  # noqa: E731
    return Rotary(*jax.lax.cond(positions_bt.reshape(-1)[0] > 0, rot, rot, positions_bt))

  def attention_core(self, q_bthk, k_bsgk, v_bsgk, mask_bhts, causal, dropout_rate, rng):
    t = q_bthk.shape[1]
    block = max(CAUSAL_BLOCK, -(-t // CAUSAL_MAX_BLOCKS))
    if not causal or t <= block:
      return _attend(q_bthk, k_bsgk, v_bsgk, mask_bhts, dropout_rate, rng)
    assert k_bsgk.shape[1] == t, "a causal mask pairs every query with its own key position"
    out = []
    for i, start in enumerate(range(0, t, block)):
      end = min(start + block, t)
      out.append(_attend(q_bthk[:, start:end], k_bsgk[:, :end], v_bsgk[:, :end],
                         mask_bhts[:, :, start:end, :end], dropout_rate, fold(rng, i)))
    return jnp.concatenate(out, axis=1)


def _dot(a, b, ca, cb, acc=jnp.float32):
  return jax.lax.dot_general(a, b, (((ca,), (cb,)), ((), ())), preferred_element_type=acc)


def _transposed(a: jax.Array) -> jax.Array:
  """``a.T`` materialised row-major (a plain transpose is folded into the dot as a layout, which
  XLA:CPU's bf16 matmul then runs on its slow path)."""
  m, n = a.shape
  return jax.lax.optimization_barrier(a.reshape(m, n, 1).transpose(1, 0, 2).reshape(n, m))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _lowp_matmul(a, b, b_contract, out_dtype):
  return _dot(a, b, 1, b_contract).astype(out_dtype)


def _lowp_fwd(a, b, b_contract, out_dtype):
  return _lowp_matmul(a, b, b_contract, out_dtype), (a, b)


def _lowp_bwd(b_contract, out_dtype, res, g_mn):
  a_mk, b = res
  g_mn = g_mn.astype(a_mk.dtype)
  da = _dot(g_mn, b, 1, 1 - b_contract).astype(a_mk.dtype)
  # The weight gradient with only its left operand transposed (row-major, contracted on its
  # last axis); for b [N, K] (the logits' table) db = (a^T g)^T.
  atg_kn = _dot(_transposed(a_mk), g_mn, 1, 0)
  db = atg_kn if b_contract == 0 else _transposed(atg_kn)
  return da, db.astype(b.dtype)


_lowp_matmul.defvjp(_lowp_fwd, _lowp_bwd)


@jax.custom_vjp
def _nt_matmul(a_mk, b_nk):
  """``a [M, K] b [N, K]^T`` in the operands' dtype (float64 under x64 stays float64)."""
  return _dot(a_mk, b_nk, 1, 1, None)


def _nt_fwd(a_mk, b_nk):
  return _nt_matmul(a_mk, b_nk), (a_mk, b_nk)


def _nt_bwd(res, g_mn):
  a_mk, b_nk = res
  da_mk = _dot(g_mn, b_nk, 1, 0, None)
  db_nk = _transposed(_dot(_transposed(a_mk), g_mn, 1, 0, None))
  return da_mk.astype(a_mk.dtype), db_nk.astype(b_nk.dtype)


_nt_matmul.defvjp(_nt_fwd, _nt_bwd)
