"""Training, mesh and checkpoint config (PAPER.md §1 "Training")."""
from __future__ import annotations

import dataclasses

from t5like.config.schema import ConfigError, check_choice, check_positive

SCHEDULES = ("warmup_cosine", "constant")


@dataclasses.dataclass
class MeshConfig:
  """Device mesh; one size may be -1 to take the remaining devices."""

  data: int = 1  # Pure data-parallel replicas.
  fsdp: int = -1  # Fully-sharded data parallel (parameters sharded over 'embed').
  tensor: int = 1  # Tensor parallel (heads / mlp / vocab).

  def validate(self) -> "MeshConfig":
    sizes = (self.data, self.fsdp, self.tensor)
    if sum(s == -1 for s in sizes) > 1:
      raise ConfigError(f"at most one mesh axis may be -1, got data/fsdp/tensor={sizes}")
    if any(s == 0 or s < -1 for s in sizes):
      raise ConfigError(f"mesh sizes must be positive or -1, got data/fsdp/tensor={sizes}")
    return self


@dataclasses.dataclass
class TrainConfig:
  """Optimisation hyper-parameters and loop settings."""

  steps: int = 400_000  # Total optimizer steps.
  batch_size: int = 2048  # Global batch in sequences (rows).
  learning_rate: float = 0.01  # Peak learning rate.
  schedule: str = "warmup_cosine"  # "warmup_cosine" (pretraining) or "constant" (instruction tuning).
  warmup_steps: int = 2000  # Linear warmup steps (warmup_cosine only).
  final_lr_fraction: float = 0.1  # Cosine decays to this fraction of the peak.
  adafactor_decay_rate: float = 0.8  # Adafactor second-moment decay exponent.
  clip_grad_norm: float = 1.0  # Global-norm gradient clipping (0 disables).
  z_loss: float = 1e-4  # Coefficient of the z-loss (log Z)^2 term.
  seed: int = 0  # Parameter init and dropout seed.

  def validate(self) -> "TrainConfig":
    check_choice("train.schedule", self.schedule, SCHEDULES)
    check_positive("train.steps", self.steps)
    check_positive("train.batch_size", self.batch_size)
    check_positive("train.learning_rate", self.learning_rate)
    check_positive("train.warmup_steps", self.warmup_steps, allow_zero=True)
    check_positive("train.z_loss", self.z_loss, allow_zero=True)
    check_positive("train.clip_grad_norm", self.clip_grad_norm, allow_zero=True)
    return self
