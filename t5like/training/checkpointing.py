"""Orbax checkpoints: train state + data-iterator state + resolved config, with fallback.

Layout of ``<workdir>/checkpoints/<step>/``:
  ``state/``   the TrainState (step, params, optimizer state, skip counters) as OCDBT/zarr arrays;
  ``data/process_<i>/``   each host's data-iterator state (``it.save``: tf.train.Checkpoint of the
               tf.data iterator for the seqio pipeline), written at save time, not later;
  ``config/metadata``   the resolved config as JSON.
Nothing is pickled. A checkpoint restores onto any mesh / device count: the restore target is
the new run's abstract state, whose arrays carry the new shardings.

Restore policy (``Checkpointer.restore``): storage errors are retried; a checkpoint whose own
files are provably bad is skipped and, once an older one restores, moved to
``<checkpoints>/../corrupt_checkpoints/`` on the same storage; anything else stops the run with
a clear error. All hosts take the same decision. Paths may be local or URIs (``gs://``).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import time
from typing import Any, Callable, NamedTuple

import jax
import orbax.checkpoint as ocp
from etils import epath

from t5like import paths
from t5like.config import CheckpointConfig, ConfigError
from t5like.errors import UserError
from t5like.data.pipeline import DataLayoutChanged
from t5like.training.step_dirs import CONFIG, DATA, STATE, check_metadata, read_step_config

log = logging.getLogger("t5like.training")



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


class RestoreError(UserError, RuntimeError):
  """Checkpoints exist but none can be restored now; the run stops instead of starting over."""


# Substrings of errors that prove a checkpoint's own files are bad (TensorStore status codes,
# JSON and tf.train.Checkpoint decode failures, files missing from a committed step).
_CORRUPT = ("DATA_LOSS", "NOT_FOUND", "No such file", "does not exist", "is missing",
            "Expecting value", "Unterminated string", "Extra data", "Invalid control character",
            "Failed to decode", "OUT_OF_RANGE", "Unexpected end", "truncated", "checksum",
            "corrupt", "does not match the directory name", "Error reading", "Error opening",
            "Unable to find", "not a valid", "bad magic", "ParseError", "Could not parse",
            "Malformed")
# Errors of the storage, not of the files: retried with backoff.
_TRANSIENT = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "ABORTED", "Connection reset",
              "Connection refused", "timed out", "Temporary failure", "Too Many Requests",
              "Service Unavailable")
# HTTP retry codes count only where a message says they are HTTP codes: a bare "429" also
# occurs in step numbers and in the random OCDBT uuid that Orbax prints with every read error.
_HTTP_RETRY = re.compile(r"(?i)\b(?:HTTP|response|status)\b\D{0,24}\b(?:408|429|500|502|503|504)\b")
# Not searched, being data rather than a diagnosis: the whole TensorStore spec (paths, uuid,
# codec settings) that Orbax appends to a read error, and TensorStore's double-quoted names.
_DATA = re.compile(r"See full TensorStore details:.*|\"[^\"\n]*\"", re.S)


def classify(error: BaseException) -> str:
  """"transient" (retry), "corrupt" (set this checkpoint aside) or "fatal" (stop and say why)."""
  chain, e = [], error
  while e is not None and len(chain) < 8:  # Orbax wraps TensorStore's status in its own errors.
    chain.append(e)
    e = e.__cause__ or e.__context__
  messages = [_DATA.sub("", str(x)) for x in chain]
  text = " | ".join(f"{type(x).__name__}: {m}" for x, m in zip(chain, messages))
  if any(t in messages[-1] for t in _CORRUPT + _TRANSIENT) or _HTTP_RETRY.search(messages[-1]):
    error = chain[-1]
  if "RESOURCE_EXHAUSTED" in text or isinstance(error, MemoryError):
    return "fatal"  # Out of memory on this mesh: not the checkpoint's fault.
  if (isinstance(error, (TimeoutError, ConnectionError)) or any(t in text for t in _TRANSIENT)
      or _HTTP_RETRY.search(text)):
    return "transient"
  if isinstance(error, (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError)):
    return "corrupt"
  if type(error).__name__ in ("DataLossError", "NotFoundError", "DecodeError"):
    return "corrupt"
  return "corrupt" if any(t in text for t in _CORRUPT) else "fatal"


class Checkpointer:
  """Saves every ``cfg.every`` steps (async), keeps the newest ``cfg.keep``, restores the newest
  good checkpoint (restore policy: ``restore``)."""

  def __init__(self, directory: str, cfg: CheckpointConfig, *, retries: int = 3,
               backoff_s: float = 1.0):
    self.directory = paths.resolve(directory)
    self.cfg = cfg
    self.retries, self.backoff_s = retries, backoff_s
    self.unfinished = unfinished_saves(self.directory)  # Before Orbax removes them (``_open``).
    if self.unfinished:
      log.warning("%s holds unfinished checkpoint save(s) %s of a run that stopped while saving; "
                  "they hold nothing to restore and are removed", self.directory,
                  self.unfinished)
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
    items = {STATE: ocp.args.StandardSave(saved_tree(state)), CONFIG: ocp.args.JsonSave(config)}
    if data_iterator is not None:
      items[DATA] = DataIteratorSave(data_iterator)
    self.manager.save(step, args=ocp.args.Composite(**items), force=True)

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def restore(self, abstract_state: Any, data_iterator: Any | None,
              check_config: Callable[[dict], None] | None = None) -> Restored | None:
    """The newest checkpoint that restores; None only when there is no checkpoint at all.

    Policy (the same decision on every host: each host's outcome is gathered and the worst
    wins): storage errors are retried ``retries`` times with backoff; a checkpoint whose own
    files are provably bad (``classify``) is skipped, and once an older one restores, the bad
    newer ones are moved to ``<checkpoints>/../corrupt_checkpoints/`` on the same storage (never
    deleted). Anything else — persistent storage errors, out of memory, or every checkpoint bad
    — raises ``RestoreError`` naming the checkpoint: a run with checkpoints never silently
    starts from step 0. ``check_config(saved_config)`` raises ConfigError for another
    architecture. A data iterator saved with other data settings is a ConfigError; a host
    without data state (fewer hosts wrote the checkpoint) makes every host restart its stream.
    """
    self.wait()
    steps = self.all_steps()
    bad: list[tuple[int, str]] = []
    for step in reversed(steps):
      outcome, detail, state = self._try(step, abstract_state, data_iterator, check_config)
      if outcome == "corrupt":
        log.warning("checkpoint %s/%d cannot be restored: %s", self.directory, step, detail)
        bad.append((step, detail))
        continue
      if outcome == "fatal":
        raise RestoreError(
            f"checkpoint {self.directory}/{step} could not be restored: {detail}. Nothing was "
            "moved or deleted; fix the cause (storage access, memory: more devices or "
            "mesh.fsdp) and restart, or set checkpoint.resume=false to start a new run")
      for b, _ in bad:
        self._set_aside(b)
      if bad:
        log.warning("resuming from the previous good checkpoint (step %d); unreadable newer "
                    "checkpoint(s) %s moved to %s", step, [b for b, _ in bad],
                    self._aside_root())
      return Restored(state, step, data_restored=outcome == "ok")
    if bad:
      raise RestoreError(
          f"none of the {len(bad)} checkpoints in {self.directory} can be restored ("
          + "; ".join(f"step {s}: {d}" for s, d in bad[:3]) + "). Nothing was moved: refusing to "
          "start from step 0 over them. Restore them from a backup, or start over with a new "
          "--workdir (or checkpoint.resume=false)")
    return None

  def _try(self, step, abstract_state, data_iterator, check_config):
    """("ok" | "data_missing" | "corrupt" | "fatal", detail, state), agreed by all hosts; a
    ConfigError on any host is raised on every host (after the agreement, so none waits)."""
    outcome, detail, state, config_error = "ok", "", None, None
    try:
      self._with_retries(lambda: check_metadata(paths.join(self.directory, str(step))), step)
      saved = self._with_retries(lambda: self.saved_config(step), step)
      if saved is None:
        raise FileNotFoundError(f"{CONFIG}/metadata is missing")
      if check_config is not None:
        check_config(saved)
      state = from_saved(self._with_retries(lambda: self.manager.restore(
          step, args=ocp.args.Composite(
              **{STATE: ocp.args.StandardRestore(saved_tree(abstract_state))}))[STATE], step),
          abstract_state)
      if int(jax.device_get(state.step)) != step:
        raise ValueError(f"state.step={int(state.step)} does not match the directory name")
      if data_iterator is not None:
        try:
          self._with_retries(lambda: self.manager.restore(step, args=ocp.args.Composite(
              **{DATA: DataIteratorRestore(data_iterator)})), step)
        except (DataStateMissing, DataLayoutChanged) as e:
          outcome, detail = "data_missing", str(e)
        except ValueError as e:
          if classify(e) == "corrupt":
            raise
          raise ConfigError(
              f"cannot resume from {self.directory}/{step}: {e}. Resume with the data settings "
              "the run was saved with; or set checkpoint.restore_data=false to keep the trained "
              "state and restart the data stream; or use a new --workdir") from None
    except ConfigError as e:
      outcome, detail, config_error = "config", str(e), e
    except _StorageError as e:
      outcome, detail = "fatal", str(e)
    except Exception as e:  # noqa: BLE001 - classified: corrupt files or a reason to stop.
      kind = classify(e)
      outcome = "corrupt" if kind == "corrupt" else "fatal"
      detail = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    agreed = _agree(outcome)
    if agreed == "config":
      raise config_error or ConfigError(
          f"cannot resume from {self.directory}/{step}: another host found a configuration "
          "mismatch (its log says which)")
    if agreed != outcome:
      detail = detail or f"another host reported {agreed}"
    if agreed == "data_missing":
      log.warning("%s: every host restarts its data stream from the beginning",
                  detail or "a host has no data state in this checkpoint")
    return agreed, detail, state

  def _with_retries(self, fn, step):
    for attempt in range(self.retries + 1):
      try:
        return fn()
      except Exception as e:  # noqa: BLE001
        if classify(e) != "transient":
          raise
        if attempt == self.retries:
          raise _StorageError(f"storage error persisted after {self.retries + 1} attempts "
                              f"({type(e).__name__}: {e})") from e
        wait = self.backoff_s * 2 ** attempt
        log.warning("reading checkpoint %s/%d: %s; retrying in %.0f s", self.directory, step, e,
                    wait)
        time.sleep(wait)

  def _aside_root(self) -> epath.Path:
    return epath.Path(self.directory).parent / "corrupt_checkpoints"

  def _set_aside(self, step: int) -> None:
    """Moves an unreadable checkpoint next to the checkpoints, on the same storage."""
    src = epath.Path(self.directory) / str(step)
    if jax.process_index() == 0 and src.exists():
      root = self._aside_root()
      root.mkdir(parents=True, exist_ok=True)
      src.rename(root / f"{step}-{int(time.time())}")
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      multihost_utils.sync_global_devices(f"t5like_set_aside_{step}")
    self.manager.close()
    self._open()

  def saved_config(self, step: int) -> dict | None:
    return read_step_config(paths.join(self.directory, str(step)))

  def close(self) -> None:
    self.wait()
    self.manager.close()


def unfinished_saves(directory: str) -> list[str]:
  """The step directories under ``directory`` that Orbax began but never committed: its
  ``<step>.orbax-checkpoint-tmp-*`` directories, and on object stores (where Orbax writes in place
  and commits with a marker) step directories without ``commit_success.txt``."""
  root = epath.Path(directory)
  if not root.is_dir():
    return []
  out = []
  for d in root.iterdir():
    if ".orbax-checkpoint-tmp" in d.name or (
        paths.is_uri(directory) and d.name.isdigit() and not (d / "commit_success.txt").exists()):
      out.append(d.name)
  return sorted(out)


class Restored(NamedTuple):
  state: Any  # The TrainState, placed as the abstract state's shardings say.
  step: int  # Its step.
  data_restored: bool  # False: the data iterators must restart (every host alike).


class _StorageError(UserError, RuntimeError):
  """A storage error that outlived the retries."""


_RANK = {"ok": 0, "data_missing": 1, "corrupt": 2, "fatal": 3, "config": 4}


def _agree(outcome: str) -> str:
  """The worst outcome over all hosts (every host then takes the same branch)."""
  if jax.process_count() == 1:
    return outcome
  import numpy as np
  from jax.experimental import multihost_utils
  ranks = multihost_utils.process_allgather(np.asarray(_RANK[outcome], np.int32))
  worst = int(np.max(ranks))
  return next(k for k, v in _RANK.items() if v == worst)


def saved_tree(state: Any) -> Any:
  """The tree written for a TrainState: without its ``model_state`` when that is empty (a dense
  model), so dense checkpoints keep the layout they had before MoE state existed."""
  if dataclasses.is_dataclass(state) and hasattr(state, "model_state") and not jax.tree.leaves(
      state.model_state):
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(state)
            if f.name != "model_state"}
  return state


def from_saved(tree: Any, abstract_state: Any) -> Any:
  return abstract_state.replace(**tree) if isinstance(tree, dict) else tree
