"""One run per workdir: ``<workdir>/run.lock``, an owner record with a lease.

A run writes ``run.lock`` (JSON: host, pid, since when, last refresh, lease) before it touches
anything else in the workdir, and refreshes it every quarter lease while it lives; at the end it
deletes it. A second run in the same workdir finds a live record and refuses with one error
naming the owner and how to take over. The record of a run that died (SIGKILL, a lost VM) is
stale once its lease has passed without a refresh — at once when its pid is gone from this
host — and the next run takes the workdir over.

The record is written and deleted with conditional writes through TensorStore's key-value store
(the library Orbax already writes its arrays with): create only if absent, refresh and delete
only if the generation is still the one this run wrote. On ``gs://`` that is an object
generation precondition; on a local disk TensorStore's file driver gives the same guarantee.
So two runs starting together cannot both win, and a run never deletes a lock it lost.
Only process 0 of a multi-process run takes the lock; every process takes its decision.
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import threading
import time
import uuid

from t5like import paths
from t5like.errors import UserError

log = logging.getLogger("t5like.training")

LOCK_NAME = "run.lock"
LEASE_ENV = "T5LIKE_LOCK_LEASE_S"
DEFAULT_LEASE_S = 120.0


class WorkdirBusy(UserError):
  """Another live run holds the workdir."""


def lease_seconds() -> float:
  try:
    return float(os.environ.get(LEASE_ENV, "") or DEFAULT_LEASE_S)
  except ValueError:
    return DEFAULT_LEASE_S


def _kvstore(workdir: str):
  """The workdir as a TensorStore key-value store (``file://`` for a local path, else the URI)."""
  import tensorstore as ts
  path = paths.resolve(workdir).rstrip("/") + "/"
  return ts.KvStore.open(path if paths.is_uri(path) else {"driver": "file", "path": path}).result()


def _alive_here(record: dict) -> bool | None:
  """Whether the owner's pid runs on this host; None when the owner is on another host."""
  if record.get("host") != socket.gethostname():
    return None
  try:
    os.kill(int(record["pid"]), 0)
  except ProcessLookupError:
    return False
  except (PermissionError, KeyError, ValueError, TypeError):
    return True  # Someone else's live process (or a record we cannot read: keep it).
  return True


def is_stale(record: dict, now: float | None = None) -> bool:
  """Whether the run that wrote ``record`` is gone: its pid has died on this host, or its lease
  passed without a refresh."""
  now = time.time() if now is None else now
  if _alive_here(record) is False:
    return True
  try:
    return now > float(record["refreshed_s"]) + float(record["lease_s"])
  except (KeyError, ValueError, TypeError):
    return True  # Not a record this module wrote completely.


def _utc(seconds: float) -> str:
  return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime(
      "%Y-%m-%d %H:%M:%S UTC")


def busy_message(workdir: str, record: dict, now: float | None = None) -> str:
  now = time.time() if now is None else now
  lock = paths.join(workdir, LOCK_NAME)
  remove = f"gcloud storage rm {lock}" if paths.is_uri(lock) else f"rm {lock}"
  try:
    since = _utc(float(record["since_s"]))
    ago = now - float(record["refreshed_s"])
    expires = float(record["refreshed_s"]) + float(record["lease_s"])
  except (KeyError, ValueError, TypeError):
    since, ago, expires = "?", float("nan"), now
  return (f"the workdir {workdir} is in use by another run: pid {record.get('pid', '?')} on "
          f"host {record.get('host', '?')}, since {since} (its lock was refreshed {ago:.0f} s "
          f"ago). Wait for it to finish or stop it, or use another --workdir. If that run is "
          f"dead, its lock expires at {_utc(expires)} and the same command then takes over; to "
          f"take over now, remove the lock: {remove}")


class WorkdirLock:
  """``acquire()`` or raise ``WorkdirBusy``; a daemon thread refreshes the lease; ``release()``."""

  def __init__(self, workdir: str, lease_s: float | None = None):
    self.workdir = paths.resolve(workdir)
    self.lease_s = lease_seconds() if lease_s is None else lease_s
    self.token = uuid.uuid4().hex
    self.since = time.time()
    self.lost = False  # Another run took the workdir over while this one lived.
    self._kv = _kvstore(self.workdir)
    self._generation = None
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None

  def _record(self) -> bytes:
    return json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": _utc(self.since),
                       "since_s": self.since, "refreshed_s": time.time(),
                       "lease_s": self.lease_s, "token": self.token}).encode()

  def read(self) -> tuple[dict | None, bytes]:
    """(the record in the workdir or None, its storage generation)."""
    r = self._kv.read(LOCK_NAME).result()
    if r.state != "value":
      return None, r.stamp.generation
    try:
      record = json.loads(r.value)
    except (json.JSONDecodeError, UnicodeDecodeError):
      record = {}
    return (record if isinstance(record, dict) else {}), r.stamp.generation

  def acquire(self) -> "WorkdirLock":
    for _ in range(5):
      record, generation = self.read()
      if record is not None:
        if not is_stale(record):
          raise WorkdirBusy(busy_message(self.workdir, record))
        log.warning("taking over the workdir %s from a run that is gone (pid %s on host %s, "
                    "lock last refreshed %s)", self.workdir, record.get("pid", "?"),
                    record.get("host", "?"), _utc(float(record.get("refreshed_s", 0) or 0)))
      written = self._kv.write(LOCK_NAME, self._record(), if_equal=generation).result()
      if written.generation:  # Empty: the precondition failed (another run wrote first).
        self._generation = written.generation
        self._thread = threading.Thread(target=self._refresh_loop, name="workdir-lock",
                                        daemon=True)
        self._thread.start()
        return self
    record, _ = self.read()
    raise WorkdirBusy(busy_message(self.workdir, record or {}))

  def _still_mine(self) -> bool:
    """Whether the record is this run's (besides the generation precondition of every write:
    the GCS emulator of the tests ignores preconditions on the uploads TensorStore makes)."""
    record, generation = self.read()
    if record is not None and record.get("token") == self.token:
      self._generation = generation
      return True
    return False

  def refresh(self) -> bool:
    """Extends the lease; False (and ``lost``) when the record is no longer this run's."""
    if self.lost or self._generation is None:
      return False
    written = None
    if self._still_mine():
      written = self._kv.write(LOCK_NAME, self._record(), if_equal=self._generation).result()
    if written is None or not written.generation:
      self.lost = True
      log.error("the lock of workdir %s was taken over by another run; this run's checkpoints "
                "and metrics may now mix with that run's: stop one of them", self.workdir)
      return False
    self._generation = written.generation
    return True

  def _refresh_loop(self) -> None:
    while not self._stop.wait(self.lease_s / 4):
      try:
        if not self.refresh():
          return
      except Exception as e:  # noqa: BLE001 - a storage hiccup: the next refresh retries.
        log.warning("refreshing the lock of workdir %s: %s", self.workdir, e)

  def release(self) -> None:
    """Stops refreshing and deletes the record if it is still this run's."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    if self._generation is not None and not self.lost:
      try:
        if self._still_mine():
          self._kv.write(LOCK_NAME, None, if_equal=self._generation).result()
      except Exception as e:  # noqa: BLE001 - left behind, it expires with its lease.
        log.warning("could not remove the lock of workdir %s (%s); it expires in %.0f s",
                    self.workdir, e, self.lease_s)
    self._generation = None


def hold(workdir: str) -> WorkdirLock | None:
  """The workdir's lock for this run (process 0 holds it; None on the others), or
  ``WorkdirBusy`` on every process when another run holds it."""
  import jax
  lock, error = None, None
  if jax.process_index() == 0:
    try:
      lock = WorkdirLock(workdir).acquire()
    except WorkdirBusy as e:
      error = e
  if jax.process_count() > 1:
    import numpy as np
    from jax.experimental import multihost_utils
    ok = int(multihost_utils.broadcast_one_to_all(np.int32(error is None)))
    if not ok and error is None:
      record, _ = WorkdirLock(workdir).read()
      error = WorkdirBusy(busy_message(paths.resolve(workdir), record or {}))
  if error is not None:
    raise error
  return lock
