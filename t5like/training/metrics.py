"""Metrics out: TensorBoard event files, ``metrics.jsonl``, a console progress bar with ETA.

Only process 0 writes; a metric has the same name in both (the TensorBoard tag is the
``metrics.jsonl`` key). ``metrics.jsonl`` holds one JSON object per logged step
(``{"step": ..., "loss": ..., ...}``, train scalars; ``eval_*`` keys on eval steps), appended
across restarts, so a resumed run continues the same file. Each step appears once: a run that
resumes from step N first drops the lines past N (steps an interrupted run logged after its last
checkpoint, which the resumed run redoes), and starts its TensorBoard events with a
``SessionLog.START`` at step N + 1, on which TensorBoard discards the earlier events from that
step on (its restart handling, ``purge_orphaned_data``).
"""
from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Mapping

import jax
import numpy as np
from etils import epath

from t5like import paths


class _UriEventFile:
  """An event file on a URI for tensorboardX: object stores cannot append, so the bytes are
  kept in memory and rewritten whole through epath on every flush (tensorboardX flushes every
  ``flush_secs``) and at close."""

  def __init__(self, path: str):
    self._path, self._buf = epath.Path(path), bytearray()

  def write(self, data: bytes) -> None:
    self._buf += data

  def flush(self) -> None:
    self._path.write_bytes(bytes(self._buf))

  def close(self) -> None:
    self.flush()


class _UriEventFiles:
  """tensorboardX writer factory for URI schemes (replaces its own ``gs://`` writer, which
  needs google-cloud-storage): every file the project writes goes through one layer, epath."""

  def open(self, path: str) -> _UriEventFile:
    return _UriEventFile(path)

  def directory_check(self, path: str) -> None:
    epath.Path(path).mkdir(parents=True, exist_ok=True)


def _register_uri_event_files() -> None:
  from tensorboardX import record_writer
  for scheme in ("gs", "s3", "az"):
    record_writer.register_writer_factory(scheme, _UriEventFiles())


class MetricsWriter:

  def __init__(self, workdir: str, *, total_steps: int, start_step: int, progress_bar: bool):
    self.active = jax.process_index() == 0
    self.jsonl_path = paths.join(workdir, "metrics.jsonl")
    self.tb_dir = paths.join(workdir, "tensorboard")
    self._tb = None
    self._bar = None
    if not self.active:
      return
    try:  # tensorboardX; event files on URIs through epath (`_UriEventFiles`).
      from tensorboardX import SummaryWriter
      if paths.is_uri(self.tb_dir):
        _register_uri_event_files()
      else:
        os.makedirs(self.tb_dir, exist_ok=True)
      # The start step in the name: a restart within the same second (tensorboardX names files
      # by the second and opens them "wb") must not overwrite the previous run's events.
      self._tb = SummaryWriter(self.tb_dir, flush_secs=30, filename_suffix=f".step{start_step}")
    except Exception as e:  # noqa: BLE001 - TensorBoard is optional; jsonl is always written.
      print(f"TensorBoard writer unavailable ({e}); writing metrics.jsonl only")
    if self._tb is not None:
      _start_session(self._tb, start_step)
    drop_rows_after(self.jsonl_path, start_step)
    self._jsonl = paths.AppendFile(self.jsonl_path)
    if progress_bar:
      import sys

      from tqdm import tqdm
      tty = sys.stderr.isatty()
      self._bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True,
                       smoothing=0.1, mininterval=0.5 if tty else 30.0)

  def write(self, step: int, scalars: Mapping[str, float]) -> None:
    if not self.active:
      return
    clean = {k: _py(v) for k, v in scalars.items()}
    self._jsonl.write(json.dumps({"step": step, **clean}) + "\n")
    self._jsonl.flush()  # Local: now; URI: at most every 30 s, and at close.
    if self._tb is not None:
      for k, v in clean.items():
        if isinstance(v, (int, float)) and math.isfinite(v):
          self._tb.add_scalar(_tb_name(k), v, step)

  def progress(self, step: int, postfix: Mapping[str, Any] | None = None) -> None:
    if self._bar is None:
      return
    if postfix:
      self._bar.set_postfix({k: (f"{v:.4g}" if isinstance(v, float) else v)
                             for k, v in postfix.items()}, refresh=False)
    self._bar.update(step - self._bar.n)  # Redraws at most every `mininterval` seconds.

  def message(self, text: str) -> None:
    """Prints without breaking the progress bar."""
    if not self.active:
      return
    if self._bar is not None:
      self._bar.write(text)
    else:
      print(text, flush=True)

  def close(self) -> None:
    if not self.active:
      return
    if self._bar is not None:
      self._bar.close()
    if self._tb is not None:
      self._tb.close()
    self._jsonl.close()


def _start_session(tb, start_step: int) -> None:
  """A ``SessionLog.START`` at ``start_step + 1``: TensorBoard drops earlier files' events of the
  steps this run is about to redo."""
  from tensorboardX.proto.event_pb2 import Event, SessionLog
  tb.file_writer.add_event(Event(wall_time=time.time(), step=start_step + 1,
                                 session_log=SessionLog(status=SessionLog.START)))


def drop_rows_after(jsonl_path: str, step: int) -> int:
  """Removes the lines of ``metrics.jsonl`` logged past ``step`` (and a line torn by a kill);
  how many were removed."""
  p = epath.Path(jsonl_path)
  if not p.exists():
    return 0
  lines = p.read_text().splitlines(keepends=True)

  def keep(line: str) -> bool:
    try:
      return int(json.loads(line)["step"]) <= step
    except (ValueError, KeyError, TypeError):
      return False  # Not a whole metrics row: a line torn by a kill.
  kept = [ln for ln in lines if keep(ln)]
  if len(kept) != len(lines):
    p.write_text("".join(kept))
  return len(lines) - len(kept)


def _tb_name(key: str) -> str:
  """The TensorBoard tag of a metric: its ``metrics.jsonl`` key, so that one name finds it in
  both (``loss``, ``eval_loss``, ``eval/<part>/loss``, ``tokens_per_sec``, ...)."""
  return key


def _py(v: Any) -> Any:
  if isinstance(v, (np.ndarray, np.generic, jax.Array)):
    v = np.asarray(v).item()
  return v


class IntervalStats:
  """Averages per-step scalars between log points and measures throughput."""

  def __init__(self):
    self.sums: dict[str, float] = {}
    self.last: dict[str, float] = {}
    self.count = 0
    self.t0 = time.perf_counter()

  def add(self, metrics: Mapping[str, float]) -> None:
    for k, v in metrics.items():
      self.sums[k] = self.sums.get(k, 0.0) + float(v)
      self.last[k] = float(v)
    self.count += 1

  def pause(self, seconds: float) -> None:
    """Leaves ``seconds`` (e.g. an evaluation) out of the current interval's time."""
    self.t0 += seconds

  def reset_clock(self) -> None:
    self.t0 = time.perf_counter()
    self.count = 0
    self.sums = {}

  def summary(self, *, flops_per_step: float, tokens_per_step: int, peak_flops_total: float,
              num_devices: int) -> dict[str, float]:
    n = max(self.count, 1)
    out = {k: v / n for k, v in self.sums.items()}
    for k in ("learning_rate", "skipped_steps", "consecutive_skipped"):
      if k in self.last:
        out[k] = self.last[k]
    dt = time.perf_counter() - self.t0
    if self.count and dt > 0:
      step_time = dt / self.count
      out["step_time_s"] = step_time
      out["tokens_per_sec"] = tokens_per_step / step_time
      out["target_tokens_per_sec"] = out.get("target_tokens", 0.0) / step_time
      achieved = flops_per_step / step_time
      out["tflops_per_sec_per_device"] = achieved / num_devices / 1e12
      if peak_flops_total > 0:
        out["mfu"] = achieved / peak_flops_total
    out.pop("finite", None)
    return out
