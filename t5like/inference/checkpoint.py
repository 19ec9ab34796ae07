"""Loading a train.py checkpoint for generation (the restore is ``t5like.training.restore``'s)."""
from __future__ import annotations

from typing import Sequence

from t5like.config import ConfigError


def load_model(path: str, *, step: int | None = None, overrides: Sequence[str] = ()):
  """(model, config, step_dir) of a workdir / checkpoints dir / step dir, newest step by default.

  The model is rebuilt from the config stored with the checkpoint (``overrides`` on top); a
  config whose parameter shapes differ from the saved ones is a ``ConfigError`` naming both.
  """
  from t5like.training.restore import restore_model
  try:
    return restore_model(path, step=step, overrides=overrides)
  except (ValueError, KeyError, TypeError) as e:
    if isinstance(e, ConfigError):
      raise
    raise ConfigError(
        f"the checkpoint under {path} does not match the model config"
        f"{' with overrides ' + ', '.join(overrides) if overrides else ''}: {e}; drop the "
        "--config.model.* overrides that change parameter shapes") from e
