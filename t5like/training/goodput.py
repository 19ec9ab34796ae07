"""Goodput: where a run's wall time went, per run and summed over its restarts.

Every second of a process's life, from its start (read from the kernel, so interpreter start-up
and imports count) to now, is one of:

=============  ===============================================================================
productive     train steps that advance the run (step dispatch, the device's work, metrics)
compile        waiting for the train step's compile (an ahead-of-time compile that finished
               in the background beside the restore costs only what was still left)
restore        restoring the state (and the data position) from a checkpoint
data           waiting for the next batch from the input pipeline
checkpoint     the blocking part of a checkpoint save (an async save's background write is not)
eval           held-out evaluation
recomputed     steps a restart ran again: those at or below the furthest step an earlier run of
               this workdir had reached (the work after its last checkpoint, lost to the
               preemption), counted in the run that repeats them, once
startup        the rest before the first step: interpreter, imports, building the mesh, state
               and data pipeline, the distributed start-up
other          the rest after the first step: logging, the end of the run
=============  ===============================================================================

so the shares add up to the wall time. Process 0 writes its run's record to
``<workdir>/goodput/<run>.json`` (any URI, gs:// included) at every log step and at the end; a
run killed without warning keeps the record of its last log step. ``summarize`` adds the records
of a workdir up; ``python -m t5like.tools.goodput WORKDIR`` prints them. Works offline (no Cloud
Logging, unlike MaxText's ml-goodput-measurement).
"""
from __future__ import annotations

import contextlib
import json
import time
from typing import Any, Iterator

from t5like import paths
from t5like.training import startup

CAUSES = ("compile", "restore", "data", "checkpoint", "eval", "recomputed", "startup", "other")
DIR = "goodput"
_PROCESS_START_USED = False


def _records_dir(workdir: str) -> str:
  return paths.join(workdir, DIR)


def read_records(workdir: str) -> list[dict[str, Any]]:
  """Every run's record in ``workdir``, oldest first."""
  from etils import epath
  d = epath.Path(_records_dir(workdir))
  if not d.exists():
    return []
  records = []
  for f in d.glob("*.json"):
    try:
      records.append(json.loads(f.read_text()))
    except (ValueError, OSError):
      continue  # A record cut short by a kill mid-write: that run's time is not known.
  return sorted(records, key=lambda r: r["start_time"])


def shares(record: dict[str, Any]) -> dict[str, float]:
  """``goodput`` and ``badput/<cause>``: fractions of the record's wall time (they sum to 1)."""
  wall = record["wall_s"]
  if wall <= 0:
    return {}
  out = {"goodput": record["productive_s"] / wall}
  out.update({f"badput/{c}": record["badput_s"].get(c, 0.0) / wall for c in CAUSES})
  return out


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
  """The records added up: wall, productive and badput seconds over every run."""
  total = {"runs": len(records), "wall_s": 0.0, "productive_s": 0.0,
           "badput_s": {c: 0.0 for c in CAUSES},
           "last_step": max((r["last_step"] for r in records), default=0)}
  for r in records:
    total["wall_s"] += r["wall_s"]
    total["productive_s"] += r["productive_s"]
    for c in CAUSES:
      total["badput_s"][c] += r["badput_s"].get(c, 0.0)
  return total


class Recorder:
  """This process's account (module docstring); the trainer times each cause with ``time``,
  calls ``loop_started`` before its first step and ``step_done`` after each."""

  def __init__(self, workdir: str, *, write: bool, t0: float | None = None):
    global _PROCESS_START_USED
    self.workdir, self.write = workdir, write
    if t0 is None:  # A process's first run counts from the process start, a later one from now.
      t0 = time.time() if _PROCESS_START_USED else startup.process_start_time()
      _PROCESS_START_USED = True
    self.t0 = t0
    earlier = read_records(workdir)
    self.earlier = [r for r in earlier if r.get("run") != self._run_id()]
    self.reached_before = max((r["last_step"] for r in self.earlier), default=0)
    self.badput = {c: 0.0 for c in CAUSES}
    self.productive = 0.0
    self.start_step = self.last_step = 0
    self._last: float | None = None  # End of the previous step (None: before the loop).
    self._timed = 0.0  # Seconds of timed causes since then.
    self._depth = 0

  def _run_id(self) -> str:
    millis = int(self.t0 * 1e3) % 1000
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(self.t0)) + f"-{millis:03d}"

  @contextlib.contextmanager
  def time(self, cause: str) -> Iterator[None]:
    """Charges the block's wall time to ``cause`` (nested blocks: the outermost one)."""
    self._depth += 1
    t = time.time()
    try:
      yield
    finally:
      self._depth -= 1
      if self._depth == 0:
        dt = time.time() - t
        self.badput[cause] += dt
        self._timed += dt

  def loop_started(self, step: int) -> None:
    now = time.time()
    self.start_step = self.last_step = step
    self.badput["startup"] = now - self.t0 - sum(self.badput.values())
    self._last, self._timed = now, 0.0

  def step_done(self, step: int) -> None:
    now = time.time()
    dt = max(0.0, now - self._last - self._timed)
    if step <= self.reached_before:
      self.badput["recomputed"] += dt
    else:
      self.productive += dt
    self.last_step, self._last, self._timed = step, now, 0.0

  def record(self, now: float | None = None) -> dict[str, Any]:
    """This run so far; the time since the last step not charged to a cause is ``other``
    (``startup`` before the loop)."""
    now = time.time() if now is None else now
    wall = now - self.t0
    badput = dict(self.badput)
    rest = wall - self.productive - sum(badput.values())
    badput["startup" if self._last is None else "other"] += max(0.0, rest)
    return {"run": self._run_id(), "start_time": self.t0, "updated": now, "wall_s": wall,
            "start_step": self.start_step, "last_step": self.last_step,
            "productive_s": self.productive, "badput_s": badput}

  def metrics(self) -> dict[str, float]:
    """``goodput`` / ``badput/<cause>`` over this run and the earlier ones (metrics.jsonl,
    TensorBoard), written to this run's record too. As of the last finished step."""
    rec = self.record(self._last)
    self.save(rec)
    return shares(summarize(self.earlier + [rec]))

  def save(self, rec: dict[str, Any] | None = None) -> dict[str, Any]:
    rec = self.record() if rec is None else rec
    if self.write:
      from etils import epath
      d = epath.Path(_records_dir(self.workdir))
      d.mkdir(parents=True, exist_ok=True)
      tmp = d / f".{rec['run']}.json.tmp"
      tmp.write_text(json.dumps(rec))
      tmp.replace(d / f"{rec['run']}.json")  # Atomic where the file system is.
    return rec

  def finish(self) -> dict[str, Any]:
    """The final record (written), and the summary over every run of the workdir."""
    rec = self.save()
    return {"run": rec, "total": summarize(self.earlier + [rec])}


def format_summary(records: list[dict[str, Any]]) -> str:
  """Per run and in total: wall time, goodput and each cause's share."""
  def line(name: str, r: dict[str, Any]) -> str:
    s = shares(r)
    parts = ", ".join(f"{c} {s[f'badput/{c}']:.1%}" for c in CAUSES if s.get(f"badput/{c}"))
    return (f"{name:<24} {r['wall_s'] / 3600:8.3f} h  goodput {s.get('goodput', 0):6.1%}  "
            f"({parts})")
  lines = [line(f"{r['run']} (steps {r['start_step']}-{r['last_step']})", r) for r in records]
  if records:
    total = summarize(records)
    lines.append(line(f"total ({total['runs']} runs)", total))
  return "\n".join(lines) if lines else "no goodput records"
