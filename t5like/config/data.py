"""Data pipeline config (seqio tasks/mixtures, lengths, objectives, packing)."""
from __future__ import annotations

import dataclasses

from t5like.config.schema import ConfigError, check_choice, check_positive

OBJECTIVES = ("auto", "causal", "prefix", "inputs_targets")


@dataclasses.dataclass
class DataConfig:
  """Which data to train on and how it is turned into packed arrays."""

  mixture: str = "embedded_redpajama"  # Registered seqio task or mixture to train on.
  eval_mixture: str = ""  # Task/mixture for held-out eval loss ("" = none).
  data_dir: str = ""  # Root of the on-disk corpus (RedPajama/FLAN layout); "" = embedded data.
  vocab_path: str = ""  # SentencePiece model file; "" = the embedded vocabulary.
  objective: str = "auto"  # "causal", "prefix" (split each chunk into encoder input / target),
  #   "inputs_targets" (instruction tuning), or "auto" (causal for DecLLM, prefix for RedLLM).
  sequence_length: int = 2048  # Decoder-only length (DecLLM), inputs+targets for prefix splits.
  inputs_length: int = 1024  # Encoder input length (RedLLM) / prefix budget (instruction tuning).
  targets_length: int = 1024  # Decoder target length (RedLLM) / target budget.
  pack: bool = True  # Pack several examples per row with seqio's packing.
  seed: int = 0  # Shuffle/mixing seed; the same seed gives the same batches.

  def validate(self) -> "DataConfig":
    check_choice("data.objective", self.objective, OBJECTIVES)
    for name in ("sequence_length", "inputs_length", "targets_length"):
      check_positive(f"data.{name}", getattr(self, name))
    if not self.mixture:
      raise ConfigError("data.mixture must name a registered seqio task or mixture")
    return self
