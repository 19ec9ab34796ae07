"""Start-up to the first step, measured: where a pod's start-up minutes go.

``Timeline.mark`` logs one line per milestone with the seconds since the process started (read
from the kernel, so interpreter start-up and imports count) and since the previous milestone::

  start-up: imports                      6.2 s  (+6.2 s)
  start-up: data pipeline ready          7.9 s  (+1.7 s)
  start-up: state built                  9.0 s  (+1.1 s)
  start-up: compiled                    31.4 s  (+22.4 s)  compilation cache miss, 1 written to it
  start-up: first step                  32.0 s  (+0.6 s)

``Background`` runs one function (the train step's ahead-of-time compile from the abstract state
and batch) in a thread while the caller goes on (restoring the state, reading the first batch);
``result()`` joins it and re-raises its exception.

Before such a thread starts, ``import_lazy_importers`` imports every library that runs
``etils.epy.lazy_imports()`` at import time (TFDS and what imports it: seqio, the data pipeline):
that context replaces ``builtins.__import__`` for the whole process while it is open, so a JAX
function-level import in a tracing thread (``from jax._src.hijax import HiType`` under ``vmap``)
would get one of its lazy proxies and fail ("'jax._src.hijax' is not a package").
"""
from __future__ import annotations

import logging
import os
import re
import threading
import time
from typing import Any, Callable

PREFIX = "start-up: "
ORDER = ("imports", "data pipeline ready", "state built|state restored", "compiled", "first step")
_LINE = re.compile(re.escape(PREFIX) + r"(\S+(?: \S+)*) +([0-9]+\.[0-9]) s")


def parse(text: str) -> list[tuple[str, float]]:
  """The (milestone, seconds since start) of the ``Timeline`` lines in a log."""
  return [(m.group(1), float(m.group(2))) for m in _LINE.finditer(text)]


def process_start_time() -> float:
  """Wall-clock time this process started (Linux: /proc), else when this module was imported."""
  try:
    with open("/proc/self/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()
    start_ticks = int(fields[19])  # Field 22 of stat(5), counted from after "(comm)".
    with open("/proc/stat") as f:
      boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    return boot + start_ticks / os.sysconf("SC_CLK_TCK")
  except (OSError, ValueError, IndexError, StopIteration):
    return _IMPORTED


_IMPORTED = time.time()
_RUNS = 0


def run_start_time() -> float:
  """Where a run's timeline starts: the process start for its first run (interpreter start-up
  and imports count), the call itself for later runs in the same process (the demo's second
  model, an experiment's runs), whose imports are already done."""
  global _RUNS
  _RUNS += 1
  return process_start_time() if _RUNS == 1 else time.time()


class Timeline:
  """Logs start-up milestones to ``logger`` (module docstring)."""

  def __init__(self, logger: logging.Logger, t0: float | None = None):
    self.log, self.t0 = logger, process_start_time() if t0 is None else t0
    self.last = self.t0
    self.marks: list[tuple[str, float]] = []

  def mark(self, what: str, detail: str = "") -> float:
    now = time.time()
    self.log.info("%s%-22s %7.1f s  (+%.1f s)%s", PREFIX, what, now - self.t0, now - self.last,
                  f"  {detail}" if detail else "")
    self.marks.append((what, now - self.t0))
    self.last = now
    return now - self.t0


# Imported before any thread that traces JAX starts (module docstring): each runs, or imports a
# module that runs, ``etils.epy.lazy_imports()`` at import time.
LAZY_IMPORTERS = ("tensorflow_datasets", "seqio", "t5like.data.checks", "t5like.data.counts",
                  "t5like.data.pipeline")


def import_lazy_importers() -> None:
  """Imports ``LAZY_IMPORTERS`` now, in this thread (a missing optional one is skipped: nothing
  then imports it later either)."""
  import importlib
  for name in LAZY_IMPORTERS:
    try:
      importlib.import_module(name)
    except ImportError:
      pass


class Background:
  """``fn(cancelled)`` in a daemon thread; ``result()`` waits for it and returns its value or
  raises; ``cancel()`` makes ``cancelled()`` true, for ``fn`` to stop early at a point it
  chooses (a thread cannot be stopped from outside). The libraries that patch the process's
  imports while they import (``LAZY_IMPORTERS``) are imported first."""

  def __init__(self, fn: Callable[[Callable[[], bool]], Any], name: str):
    import_lazy_importers()
    self._value: Any = None
    self._error: BaseException | None = None
    self._cancel = threading.Event()

    def target():
      try:
        self._value = fn(self._cancel.is_set)
      except BaseException as e:  # noqa: BLE001 - handed to the caller by result().
        self._error = e
    self._thread = threading.Thread(target=target, name=name, daemon=True)
    self._thread.start()

  def cancel(self) -> None:
    self._cancel.set()

  def result(self) -> Any:
    self._thread.join()
    if self._error is not None:
      raise self._error
    return self._value
