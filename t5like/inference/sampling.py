"""Next-token choice from logits: greedy, temperature, top-k and top-p (nucleus) sampling."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from t5like.ops import Reference


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How the next token is picked from the logits (applied in this order: T, top-k, top-p)."""

  temperature: float = 0.0  # 0 = greedy (argmax); > 0 divides the logits before sampling.
  top_k: int = 0  # Keep only the k most likely tokens (0 = no limit).
  top_p: float = 1.0  # Keep the smallest set of most likely tokens whose probability is >= p.

  @property
  def greedy(self) -> bool:
    return self.temperature == 0.0

  def validate(self) -> "SamplingConfig":
    if not self.temperature >= 0.0:
      raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
    if self.top_k < 0:
      raise ValueError(f"top_k must be >= 0 (0 = no limit), got {self.top_k}")
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f"top_p must be in (0, 1] (1 = no limit), got {self.top_p}")
    return self


def sample(logits_bv: jax.Array, rng: jax.Array | None, cfg: SamplingConfig,
           ops: Reference = Reference()) -> jax.Array:
  """int32 [batch] next tokens from float logits [batch, vocab]; greedy through ``ops.argmax``
  (the model's backend)."""
  logits_bv = logits_bv.astype(jnp.float32)
  if cfg.greedy:
    return ops.argmax(logits_bv)
  logits_bv = logits_bv / cfg.temperature
  neg = jnp.finfo(jnp.float32).min
  if 0 < cfg.top_k < logits_bv.shape[-1]:
    kth_b1 = jax.lax.top_k(logits_bv, cfg.top_k)[0][:, -1:]
    logits_bv = jnp.where(logits_bv < kth_b1, neg, logits_bv)
  if cfg.top_p < 1.0:
    sorted_bv = jnp.sort(logits_bv, axis=-1)[:, ::-1]
    probs_bv = jax.nn.softmax(sorted_bv, axis=-1)
    before_bv = jnp.cumsum(probs_bv, axis=-1) - probs_bv  # Mass of strictly likelier tokens.
    keep = before_bv < cfg.top_p  # The top token is always kept.
    cutoff_b1 = jnp.min(jnp.where(keep, sorted_bv, jnp.inf), axis=-1, keepdims=True)
    logits_bv = jnp.where(logits_bv < cutoff_b1, neg, logits_bv)
  return jax.random.categorical(rng, logits_bv, axis=-1).astype(jnp.int32)
