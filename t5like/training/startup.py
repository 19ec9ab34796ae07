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


class Background:
  """``fn(cancelled)`` in a daemon thread; ``result()`` waits for it and returns its value or
  raises; ``cancel()`` makes ``cancelled()`` true, for ``fn`` to stop early at a point it
  chooses (a thread cannot be stopped from outside)."""

  def __init__(self, fn: Callable[[Callable[[], bool]], Any], name: str):
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
