"""The ``cpu_kernels`` backend: ``xla_cpu`` plus the C++ kernels of ``t5like/kernels`` where
they serve the operands (float32 or bfloat16 as each says, one CPU device, the library built;
each kernel's ``applies``), else the ``xla_cpu`` forms. Only this module calls the kernels.

- ``norm_rope``: the Q/K/V norm and RoPE in one pass per tensor (``head_norm``), not ~10
  XLA:CPU kernels over [batch, length, heads, head_dim].
- ``attention_core``: the train step's core, forward and backward (``attention_train``), each
  query over its first to last allowed key; elsewhere without dropout the few-row core
  (``cache_attention``: a decode step's one token per row over its cache, a prompt under its
  mask), whose gradient is the reference form's.
- ``argmax``: greedy decoding's argmax (XLA:CPU's is a slow variadic reduce).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from t5like.kernels import argmax, attention_train, cache_attention, head_norm
from t5like.ops.reference import dot_product_attention
from t5like.ops.xla_cpu import XlaCpu


@dataclasses.dataclass(frozen=True)
class CpuKernels(XlaCpu):
  name = "cpu_kernels"

  def norm_rope(self, x_bthd, scale_d, rot, eps):
    if scale_d is None or not head_norm.applies(x_bthd, rot):
      return super().norm_rope(x_bthd, scale_d, rot, eps)
    return head_norm.norm_rope(x_bthd, scale_d, rot, eps).astype(x_bthd.dtype)

  def attention_core(self, q_bthk, k_bsgk, v_bsgk, mask_bhts, causal, dropout_rate, rng):
    if dropout_rate == 0.0 or rng is None:
      if attention_train.applies(q_bthk, k_bsgk, v_bsgk, mask_bhts):
        return attention_train.attend(q_bthk, k_bsgk, v_bsgk, mask_bhts)
      if cache_attention.applies(q_bthk, k_bsgk, v_bsgk):
        return _few_rows(q_bthk, k_bsgk, v_bsgk, mask_bhts)
    return super().attention_core(q_bthk, k_bsgk, v_bsgk, mask_bhts, causal, dropout_rate, rng)

  def argmax(self, logits_bv):
    if argmax.applies(logits_bv):
      return argmax.argmax(logits_bv)
    return super().argmax(logits_bv)


@jax.custom_vjp
def _few_rows(q_bthk, k_bsgk, v_bsgk, mask_bhts):
  """``dot_product_attention`` (the reference form) on ``cache_attention`` (float32, no dropout): heads-
  major, a kv group's query heads stacked along the query rows."""
  b, t, h, d = q_bthk.shape
  g = k_bsgk.shape[2]
  q_bgrd = jnp.swapaxes(q_bthk * jnp.asarray(d ** -0.5, q_bthk.dtype), 1, 2).reshape(
      b, g, h // g * t, d)
  if mask_bhts.shape[1:3] == (1, 1):  # One mask row for every query: the decode step's cache.
    valid = jnp.broadcast_to(mask_bhts[:, 0, 0], (b, mask_bhts.shape[-1]))
  else:
    valid = jnp.broadcast_to(mask_bhts, (b, h, t, mask_bhts.shape[-1])).reshape(
        b, g, h // g * t, -1)
  out_bgrd = cache_attention.attend(q_bgrd, jnp.swapaxes(k_bsgk, 1, 2),
                                    jnp.swapaxes(v_bsgk, 1, 2), valid)
  return jnp.swapaxes(out_bgrd.reshape(b, h, t, d), 1, 2)


def _few_rows_fwd(q, k, v, mask):
  return _few_rows(q, k, v, mask), (q, k, v, mask)


def _few_rows_bwd(res, g):
  q, k, v, mask = res
  _, vjp = jax.vjp(functools.partial(dot_product_attention, mask_bhts=mask), q, k, v)
  return (*vjp(g), None)


_few_rows.defvjp(_few_rows_fwd, _few_rows_bwd)
