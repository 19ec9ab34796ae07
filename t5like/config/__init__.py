"""The t5like config: one typed dataclass tree, loaded from ``configs/*.py`` and overridden by flags.

A config file defines ``get_config() -> t5like.config.Config``. Overrides use dotted keys
(``--config.model.d_model=256``); unknown keys are rejected with the list of valid ones and the
whole tree is validated before anything is built.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import Iterable

from t5like.config.data import DataConfig
from t5like.config.model import PAPER_SIZES, ModelConfig, paper_model
from t5like.config.schema import ConfigError, apply_dict, apply_overrides, to_dict, to_json
from t5like.config.train import CheckpointConfig, DistributedConfig, MeshConfig, TrainConfig


@dataclasses.dataclass
class Config:
  """Everything one run needs."""

  model: ModelConfig = dataclasses.field(default_factory=ModelConfig)  # Architecture.
  data: DataConfig = dataclasses.field(default_factory=DataConfig)  # Data pipeline.
  train: TrainConfig = dataclasses.field(default_factory=TrainConfig)  # Optimisation.
  mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)  # Device mesh.
  checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)  # Orbax.
  distributed: DistributedConfig = dataclasses.field(default_factory=DistributedConfig)  # Hosts.

  def validate(self) -> "Config":
    for f in dataclasses.fields(self):
      getattr(self, f.name).validate()
    if self.model.attention_impl in ("cudnn", "auto"):  # auto: cudnn on Hopper+ GPUs.
      self._resolve_cudnn_segments()
    if self.data.loss_on_inputs and (self.model.family != "decllm"
                                     or self.model.decoder_attention != "causal"):
      raise ConfigError("data.loss_on_inputs=True is the causal decoder's full-sequence loss: it "
                        "needs model.family='decllm' with model.decoder_attention='causal' (a "
                        "non-causal decoder and RedLLM train on the targets)")
    moe, ep = self.model.moe, self.mesh.expert
    if moe.enabled and ep > 1 and moe.capacity_factor <= 0:
      raise ConfigError(f"mesh.expert={ep} splits the experts over devices, which the dropless "
                        "MoE path cannot dispatch to; set model.moe.capacity_factor (e.g. 1.25) "
                        "or mesh.expert=1")
    if moe.enabled and ep > 1 and moe.num_experts % ep:
      raise ConfigError(f"model.moe.num_experts={moe.num_experts} is not divisible by "
                        f"mesh.expert={ep}; each expert-parallel shard holds the same number")
    return self

  def _resolve_cudnn_segments(self) -> None:
    """cuDNN's plain call serves one example per row; packed rows take its packed layout."""
    m = self.model
    if m.max_segments_per_row == 0 and not self.data.pack:
      m.max_segments_per_row = 1  # One segment per row: the plain cuDNN call.
    elif m.max_segments_per_row == 1 and self.data.pack and m.attention_impl == "cudnn":
      raise ConfigError("model.max_segments_per_row=1 (one example per row, the plain cuDNN "
                        "call) cannot isolate data.pack=True's packed examples: set "
                        "model.max_segments_per_row=0 (auto) or the most segments a row holds, "
                        "or data.pack=False")


def load_config(path: str, overrides: Iterable[str] = ()) -> Config:
  """Loads ``get_config()`` from a Python config file, applies overrides, validates."""
  if not os.path.exists(path):
    here = os.path.dirname(path) or "."
    avail = sorted(p for p in os.listdir(here) if p.endswith(".py")) if os.path.isdir(here) else []
    raise ConfigError(f"config file {path!r} does not exist; available in {here}: {avail}")
  spec = importlib.util.spec_from_file_location(f"t5like_config_{abs(hash(path))}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)  # type: ignore[union-attr]
  if not hasattr(module, "get_config"):
    raise ConfigError(f"config file {path!r} must define get_config() returning a Config")
  cfg = module.get_config()
  if not isinstance(cfg, Config):
    raise ConfigError(f"{path}: get_config() returned {type(cfg).__name__}, expected Config")
  apply_overrides(cfg, overrides)
  return cfg.validate()


__all__ = [
    "CheckpointConfig", "Config", "ConfigError", "DataConfig", "DistributedConfig", "MeshConfig",
    "ModelConfig", "PAPER_SIZES", "TrainConfig", "apply_dict", "apply_overrides", "load_config",
    "paper_model", "to_dict", "to_json",
]
