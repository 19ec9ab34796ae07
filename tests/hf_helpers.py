"""Tiny t5like checkpoints and their Hugging Face exports, for tests/tools (numpy only) and
tests/hf (PyTorch)."""
from __future__ import annotations

import os

import jax
import numpy as np
from flax import nnx

from t5like.config import Config, apply_dict
from t5like.config.model import ModelConfig
from t5like.config.schema import to_dict
from t5like.models import build_model
from t5like.tools import export_hf, import_hf

VOCAB = 8192  # The embedded SentencePiece vocabulary (data.vocab_path="").


def tiny_config(family: str, **overrides) -> Config:
  fields = dict(family=family, vocab_size=VOCAB, d_model=32, num_heads=4, head_dim=8, d_ff=64,
                num_layers=2, num_encoder_layers=2, num_decoder_layers=2,
                attn_out_norm=family == "redllm", dtype="float32", scan_layers=False)
  fields.update(overrides)
  cfg = apply_dict(Config(), {"model": to_dict(ModelConfig(**fields))})
  return cfg.validate()


def random_params(cfg: Config, seed: int = 0) -> dict:
  """The model's initial parameters with every norm scale drawn away from 1 (so a norm that an
  export dropped or misplaced changes the logits)."""
  model = build_model(cfg.model, nnx.Rngs(seed))
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  rng = np.random.RandomState(seed)

  def perturb(path, a):
    a = np.asarray(a)
    if "scale" in jax.tree_util.keystr(path):
      return (a * rng.uniform(0.5, 1.5, a.shape)).astype(a.dtype)
    return a
  return jax.tree_util.tree_map_with_path(perturb, params)


def make_export(tmp: str, family: str, *, seed: int = 0, max_shard_bytes: int = 5 * 10**9,
                **overrides) -> tuple[str, str, dict, Config]:
  """(workdir, HF dir, params, config) of a tiny random checkpoint exported to ``tmp``."""
  cfg = tiny_config(family, **overrides)
  params = random_params(cfg, seed)
  workdir, out = os.path.join(tmp, "workdir"), os.path.join(tmp, "hf")
  import_hf.write_checkpoint(cfg, params, workdir, step=7)
  export_hf.export_checkpoint(workdir, out, max_shard_bytes=max_shard_bytes)
  return workdir, out, params, cfg
