"""Tiny float32 configs and batches shared by the model tests."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from t5like.config.model import ModelConfig
from t5like.models import build_model


def tiny_cfg(family: str = "decllm", **overrides) -> ModelConfig:
  base = dict(family=family, vocab_size=97, d_model=32, num_heads=4, head_dim=8, d_ff=64,
              num_layers=2, num_encoder_layers=2, num_decoder_layers=2,
              attn_out_norm=(family == "redllm"), dtype="float32")
  base.update(overrides)
  return ModelConfig(**base).validate()


def tiny_model(family: str = "decllm", seed: int = 0, **overrides):
  return build_model(tiny_cfg(family, **overrides), nnx.Rngs(seed))


def tokens(shape, seed=0, vocab=97) -> jnp.ndarray:
  return jnp.asarray(np.random.RandomState(seed).randint(3, vocab, size=shape), jnp.int32)


@nnx.jit
def forward(model, batch):
  """Jitted forward pass (eager op-by-op dispatch is what makes tiny-model tests slow)."""
  return model(batch)
