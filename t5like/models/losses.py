"""Token cross-entropy with loss weights and z-loss (PaLM/T5X: ``z_loss * log(Z)^2``)."""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class LossTerms(NamedTuple):
  """Weighted sums over tokens; divide by ``weight`` for per-token means."""
  loss: jax.Array  # cross-entropy + z-loss, summed.
  cross_entropy: jax.Array  # summed cross-entropy.
  z_loss: jax.Array  # summed z_loss * log(Z)^2.
  correct: jax.Array  # summed hits: tokens whose target logit is the largest (ties count).
  weight: jax.Array  # sum of loss weights (number of target tokens).


def cross_entropy_with_z_loss(logits_btv: jax.Array, targets_bt: jax.Array,
                              weights_bt: jax.Array | None, z_loss: float) -> LossTerms:
  """Loss terms of float32 ``logits`` [batch, length, vocab] against integer ``targets``."""
  logits_btv = logits_btv.astype(jnp.float32)
  if weights_bt is None:
    weights_bt = (targets_bt > 0).astype(jnp.float32)
  weights_bt = weights_bt.astype(jnp.float32)
  log_z_bt = jax.nn.logsumexp(logits_btv, axis=-1)
  target_logit_bt = jnp.take_along_axis(logits_btv, targets_bt[..., None], axis=-1)[..., 0]
  ce_bt = log_z_bt - target_logit_bt
  z_bt = z_loss * jnp.square(log_z_bt)
  # A hit: no logit above the target's (a tie counts). The max is the one the log-sum-exp
  # takes anyway (XLA merges the two); an argmax over the vocabulary is a variadic reduce that
  # XLA:CPU ran as a separate ~37 ms pass per small-model step (docs/performance.md).
  max_bt = jax.lax.stop_gradient(jnp.max(logits_btv, axis=-1))
  correct_bt = (target_logit_bt >= max_bt).astype(jnp.float32)
  w = lambda v: jnp.sum(v * weights_bt)  # noqa: E731
  return LossTerms(w(ce_bt + z_bt), w(ce_bt), w(z_bt), w(correct_bt), jnp.sum(weights_bt))
