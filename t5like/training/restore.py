"""A train.py checkpoint back as a model: find its step directory, rebuild the config stored with
it (overrides on top) and restore the parameters. Used by generation, ``eval.py`` and the
experiments, so it lives next to checkpointing, below all of them.
"""
from __future__ import annotations

import os
from typing import Iterable, Sequence

from etils import epath

from t5like import partitioning, paths
from t5like.config import Config, ConfigError, apply_dict, apply_overrides
from t5like.errors import UserError


class CheckpointNotFound(UserError, FileNotFoundError):
  """No checkpoint (or not the step asked for) under the path given."""


def load_checkpoint_config(step_dir: str, overrides: Iterable[str] = ()) -> Config:
  """The resolved config stored with a checkpoint, with ``overrides`` applied, validated."""
  from t5like.training import step_dirs  # Orbax only when a checkpoint is read.
  saved = step_dirs.read_step_config(step_dir)
  if saved is None:
    raise ConfigError(f"{step_dir} has no stored config (expected {step_dir}/config/metadata)")
  cfg = apply_dict(Config(), saved)
  cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor = 1, -1, 1  # Whatever devices evaluate it.
  apply_overrides(cfg, overrides)
  return cfg.validate()


def find_step_dir(path: str, step: int | None = None) -> str:
  """A workdir / checkpoints dir / step dir (and optionally a step) -> that step's directory."""
  from t5like.training import step_dirs
  if step is not None:
    base = epath.Path(paths.resolve(path))
    for root in (base / "checkpoints", base):
      if (root / str(step) / step_dirs.STATE).is_dir():
        return os.fspath(root / str(step))
    raise CheckpointNotFound(f"no checkpoint for step {step} under {path} "
                            f"(expected {path}/checkpoints/{step}/state)")
  try:
    return step_dirs.resolve_step_dir(path)
  except FileNotFoundError:
    raise CheckpointNotFound(
        f"no checkpoint found under {path!r}; expected <workdir>/checkpoints/<step>/state "
        "as written by train.py") from None


def restore_model(path: str, *, step: int | None = None, overrides: Sequence[str] = ()):
  """(model, config, step_dir): the nnx model of a checkpoint with its stored config."""
  from flax import nnx
  from t5like.training import state as state_lib, step_dirs
  step_dir = find_step_dir(path, step)
  cfg = load_checkpoint_config(step_dir, overrides)
  setup = state_lib.build_setup(cfg, partitioning.make_mesh(cfg.mesh))
  params = step_dirs.restore_params(step_dir, setup.abstract_state.params)
  model_state = step_dirs.restore_model_state(step_dir, setup.abstract_state.model_state)
  return nnx.merge(setup.graphdef, params, model_state), cfg, step_dir
