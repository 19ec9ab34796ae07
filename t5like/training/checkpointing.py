"""Orbax checkpoints: train state + data-iterator state + resolved config, with fallback.

Layout of ``<workdir>/checkpoints/<step>/``:
  ``state/``   the TrainState (step, params, optimizer state, skip counters) as OCDBT/zarr arrays;
  ``data/process_<i>/``   each host's data-iterator state (``it.save``: tf.train.Checkpoint of the
               tf.data iterator for the seqio pipeline), written at save time, not later;
  ``config/metadata``   the resolved config as JSON.
Nothing is pickled. A checkpoint restores onto any mesh / device count: the restore target is
the new run's abstract state, whose arrays carry the new shardings.

A checkpoint that fails to restore (truncated, corrupt, missing item) is reported, moved to
``<checkpoints>/../corrupt_checkpoints/``, and the next older one is tried.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from t5like.config import CheckpointConfig, ConfigError

log = logging.getLogger("t5like.training")

STATE, DATA, CONFIG = "state", "data", "config"


# ---------------------------------------------------------------------------------------------
# The data-iterator item: a tiny synchronous Orbax handler around ``it.save`` / ``it.restore``.


@dataclasses.dataclass
class DataIteratorSave(ocp.args.CheckpointArgs):
  iterator: Any


@dataclasses.dataclass
class DataIteratorRestore(ocp.args.CheckpointArgs):
  iterator: Any


class DataStateMissing(FileNotFoundError):
  """The checkpoint has no data state for this process (written by fewer processes)."""


class DataIteratorHandler(ocp.CheckpointHandler):
  """Each process saves/restores its own iterator under ``process_<index>``.

  It is a synchronous handler: Orbax runs it inside ``CheckpointManager.save`` before returning,
  so the saved position is exactly the batches consumed up to the checkpointed step.
  """

  def save(self, directory: epath.Path, args: DataIteratorSave):
    path = directory / f"process_{jax.process_index()}"
    path.mkdir(parents=True, exist_ok=True)
    args.iterator.save(os.fspath(path))

  def restore(self, directory: epath.Path, args: DataIteratorRestore):
    path = directory / f"process_{jax.process_index()}"
    if not path.exists():
      raise DataStateMissing(
          f"{path} is missing: this checkpoint was written by fewer processes than are running "
          f"now ({jax.process_count()}); the data position of this host cannot be restored")
    args.iterator.restore(os.fspath(path))
    return args.iterator


ocp.args.register_with_handler(DataIteratorHandler, for_save=True)(DataIteratorSave)
ocp.args.register_with_handler(DataIteratorHandler, for_restore=True)(DataIteratorRestore)


# ---------------------------------------------------------------------------------------------


class Checkpointer:
  """Saves every ``cfg.every`` steps (async), keeps the newest ``cfg.keep``, restores with
  fallback to an older checkpoint when the newest is unreadable."""

  def __init__(self, directory: str, cfg: CheckpointConfig):
    self.directory = os.path.abspath(directory)
    self.cfg = cfg
    self._open()

  def _open(self):
    options = ocp.CheckpointManagerOptions(
        max_to_keep=self.cfg.keep or None,
        enable_async_checkpointing=self.cfg.async_save,
        create=True,
        cleanup_tmp_directories=True,  # Half-written (uncommitted) saves of a killed run.
    )
    self.manager = ocp.CheckpointManager(
        self.directory, options=options,
        item_handlers={STATE: ocp.StandardCheckpointHandler(),
                       CONFIG: ocp.JsonCheckpointHandler(),
                       DATA: DataIteratorHandler()})

  def all_steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def latest_step(self) -> int | None:
    steps = self.all_steps()
    return steps[-1] if steps else None

  def save(self, step: int, state: Any, config: dict, data_iterator: Any | None) -> None:
    """Starts saving ``state`` as checkpoint ``step`` (returns once the device arrays are copied
    and the iterator state is written; the array files are written in the background)."""
    if step in self.manager.all_steps():
      return
    items = {STATE: ocp.args.StandardSave(state), CONFIG: ocp.args.JsonSave(config)}
    if data_iterator is not None:
      items[DATA] = DataIteratorSave(data_iterator)
    self.manager.save(step, args=ocp.args.Composite(**items), force=True)

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def restore(self, abstract_state: Any, data_iterator: Any | None,
              ) -> tuple[Any, int] | None:
    """Restores the newest checkpoint that restores cleanly; None when there is none.

    ``abstract_state``: ShapeDtypeStructs with the shardings wanted *now* (any mesh).
    ``data_iterator``: restored in place (its position after the checkpointed step).
    A checkpoint whose state or data item fails to read is reported and moved aside, and the
    previous one is tried. A data iterator saved with other data settings (the pipeline raises
    ValueError) is a configuration error, not corruption: it raises ConfigError.
    """
    self.wait()
    for step in reversed(self.all_steps()):
      try:
        state = self.manager.restore(
            step, args=ocp.args.Composite(**{STATE: ocp.args.StandardRestore(abstract_state)}))
        state = state[STATE]
        if int(jax.device_get(state.step)) != step:
          raise ValueError(f"state.step={int(state.step)} does not match the directory name")
      except Exception as e:  # noqa: BLE001 - any failure means: try the previous one.
        self._give_up_on(step, e)
        continue
      if data_iterator is not None:
        try:
          self.manager.restore(
              step, args=ocp.args.Composite(**{DATA: DataIteratorRestore(data_iterator)}))
        except DataStateMissing as e:
          log.warning("%s; this host's data iterator starts from the beginning", e)
        except ValueError as e:
          raise ConfigError(
              f"cannot resume from {self.directory}/{step}: {e}. Resume with the data settings "
              "the run was saved with; or set checkpoint.restore_data=false to keep the trained "
              "state and restart the data stream; or use a new --workdir"
          ) from None
        except Exception as e:  # noqa: BLE001
          self._give_up_on(step, e)
          continue
      return state, step
    return None

  def _give_up_on(self, step: int, error: Exception) -> None:
    older = [s for s in self.all_steps() if s < step]
    text = str(error).splitlines()[0][:300] if str(error) else ""
    msg = (f"checkpoint {self.directory}/{step} failed to restore ({type(error).__name__}: "
           f"{text}); ")
    msg += (f"falling back to the previous checkpoint (step {older[-1]})" if older else
            "no older checkpoint: starting from scratch")
    log.warning(msg)
    self._quarantine(step)

  def _quarantine(self, step: int) -> None:
    """Moves an unreadable checkpoint aside (kept for inspection; the step can be re-saved)."""
    src = os.path.join(self.directory, str(step))
    if jax.process_index() == 0 and os.path.exists(src):
      dst_root = os.path.join(os.path.dirname(self.directory), "corrupt_checkpoints")
      os.makedirs(dst_root, exist_ok=True)
      shutil.move(src, os.path.join(dst_root, f"{step}-{int(time.time())}"))
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      multihost_utils.sync_global_devices(f"t5like_quarantine_{step}")
    self.manager.close()
    self._open()

  def saved_config(self, step: int) -> dict | None:
    path = os.path.join(self.directory, str(step), CONFIG, "metadata")
    if not os.path.exists(path):
      return None
    with open(path) as f:
      return json.load(f)

  def close(self) -> None:
    self.wait()
    self.manager.close()


# ---------------------------------------------------------------------------------------------
# Parameters only, from another run (instruction tuning from a pretrained checkpoint).


def resolve_step_dir(path: str) -> str:
  """A workdir, a checkpoints/ directory, or one ``<step>`` directory -> the step directory."""
  p = os.path.abspath(os.path.expanduser(path))
  if not os.path.isdir(p):
    raise FileNotFoundError(f"train.init_from={path!r}: no such directory")
  if os.path.isdir(os.path.join(p, STATE)):
    return p
  if os.path.basename(p) == STATE:
    return os.path.dirname(p)
  for root in (os.path.join(p, "checkpoints"), p):
    if os.path.isdir(root):
      steps = sorted((int(d) for d in os.listdir(root)
                      if d.isdigit() and os.path.isdir(os.path.join(root, d, STATE))))
      if steps:
        return os.path.join(root, str(steps[-1]))
  raise FileNotFoundError(
      f"train.init_from={path!r} holds no checkpoint (expected <dir>/checkpoints/<step>/state, "
      f"<dir>/<step>/state or <step>/state)")


def read_step_config(step_dir: str) -> dict | None:
  path = os.path.join(step_dir, CONFIG, "metadata")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def restore_params(step_dir: str, abstract_params: Any) -> Any:
  """Only the parameters of the TrainState in ``step_dir/state``, placed as ``abstract_params``
  says (their shardings); the optimizer state in the checkpoint is not read."""
  restore_args = ocp.checkpoint_utils.construct_restore_args(abstract_params)
  with ocp.PyTreeCheckpointer() as ckptr:
    out = ckptr.restore(
        os.path.join(step_dir, STATE),
        args=ocp.args.PyTreeRestore(item={"params": abstract_params},
                                    restore_args={"params": restore_args},
                                    partial_restore=True))
  return out["params"]
