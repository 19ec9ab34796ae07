"""Model code: the two families share every layer and differ only in how stacks are wired."""
from __future__ import annotations

from flax import nnx

from t5like import ops
from t5like.config.model import ModelConfig
from t5like.models.decllm import DecLLM
from t5like.models.losses import LossTerms, cross_entropy_with_z_loss
from t5like.models.redllm import RedLLM


def build_model(cfg: ModelConfig, rngs: nnx.Rngs, mesh=None) -> DecLLM | RedLLM:
  """Builds the family named by ``cfg.family`` (validated first), its operations' backend
  chosen for ``mesh``'s devices (None: this process's default backend; ``ops.resolve``)."""
  cfg = ops.resolve(cfg.validate(), mesh)
  return DecLLM(cfg, rngs=rngs) if cfg.family == "decllm" else RedLLM(cfg, rngs=rngs)


__all__ = ["DecLLM", "LossTerms", "RedLLM", "build_model", "cross_entropy_with_z_loss"]
