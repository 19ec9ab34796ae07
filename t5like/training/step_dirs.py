"""One checkpoint step directory, read on its own: where it is (a workdir, a ``checkpoints/``
directory or ``<step>/``), whether its metadata is intact, the config saved with it, and its
parameters (or MoE state) without the optimizer state, for instruction tuning and evaluation.
The layout is ``checkpointing.py``'s; paths may be local or URIs (``gs://``).
"""
from __future__ import annotations

import json
import os
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from t5like import paths

STATE, DATA, CONFIG = "state", "data", "config"  # The items of a step directory.


# The JSON files every committed step directory has; a missing or unparsable one proves the step
# is damaged (Orbax itself then fails with structural errors that do not say why).
METADATA_FILES = ("_CHECKPOINT_METADATA", f"{STATE}/_METADATA", f"{CONFIG}/metadata")


def check_metadata(step_dir: str) -> None:
  """Raises FileNotFoundError / JSONDecodeError for a missing or unparsable metadata file."""
  for name in METADATA_FILES:
    path = epath.Path(step_dir) / name
    if not path.exists():
      raise FileNotFoundError(f"{name} is missing")
    try:
      json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise json.JSONDecodeError(f"{name} is not valid JSON ({e})", "", 0) from None


def resolve_step_dir(path: str) -> str:
  """A workdir, a checkpoints/ directory, or one ``<step>`` directory -> the step directory."""
  p = epath.Path(paths.resolve(path))
  if not p.is_dir():
    raise FileNotFoundError(f"train.init_from={path!r}: no such directory")
  if (p / STATE).is_dir():
    return os.fspath(p)
  if p.name == STATE:
    return os.fspath(p.parent)
  for root in (p / "checkpoints", p):
    if root.is_dir():
      steps = sorted(int(d.name) for d in root.iterdir()
                     if d.name.isdigit() and (d / STATE).is_dir())
      if steps:
        return os.fspath(root / str(steps[-1]))
  raise FileNotFoundError(
      f"train.init_from={path!r} holds no checkpoint (expected <dir>/checkpoints/<step>/state, "
      f"<dir>/<step>/state or <step>/state)")


def read_step_config(step_dir: str) -> dict | None:
  """The config saved with a checkpoint; None if it has none. Unparsable JSON raises."""
  path = epath.Path(step_dir) / CONFIG / "metadata"
  if not path.exists():
    return None
  return json.loads(path.read_text())


def _restore_field(step_dir: str, name: str, abstract: Any) -> Any:
  """The TrainState field ``name`` alone from ``step_dir/state``, placed as ``abstract`` says
  (its shardings); the rest of the checkpoint is not read."""
  restore_args = ocp.checkpoint_utils.construct_restore_args(abstract)
  with ocp.PyTreeCheckpointer() as ckptr:
    out = ckptr.restore(
        paths.join(step_dir, STATE),
        args=ocp.args.PyTreeRestore(item={name: abstract}, restore_args={name: restore_args},
                                    partial_restore=True))
  return out[name]


def restore_model_state(step_dir: str, abstract_model_state: Any) -> Any:
  """Only the TrainState's ``model_state`` (MoE selection biases); ``{}`` for a dense model."""
  if not jax.tree.leaves(abstract_model_state):
    return abstract_model_state
  return _restore_field(step_dir, "model_state", abstract_model_state)


def restore_params(step_dir: str, abstract_params: Any) -> Any:
  """Only the parameters of the TrainState; the optimizer state in the checkpoint is not read."""
  return _restore_field(step_dir, "params", abstract_params)
