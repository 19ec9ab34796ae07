"""User paths that may be local or any URI the file libraries support (``gs://``, ...).

Every file a user names goes through etils ``epath`` (backed by ``tf.io.gfile`` for cloud
schemes) or Orbax; ``os.path`` only ever sees local paths. Local paths are made absolute so
every process resolves them the same way; a URI is left exactly as given (``os.path.abspath``
would turn ``gs://b/run`` into ``<cwd>/gs:/b/run``).
"""
from __future__ import annotations

import os

from etils import epath


def is_uri(path: str) -> bool:
  return "://" in str(path)


def resolve(path: str) -> str:
  """Absolute local path, or the URI unchanged."""
  path = os.fspath(path)
  return path if is_uri(path) else os.path.abspath(os.path.expanduser(path))


def join(base: str, *parts: str) -> str:
  return os.fspath(epath.Path(base).joinpath(*parts))


def parent(path: str) -> str:
  return os.fspath(epath.Path(path).parent)


class AppendFile:
  """A text file that grows by appended lines, at a local path or a URI.

  Object stores cannot append, so a URI file is read once, kept in memory and rewritten whole:
  the first line at once (the file shows up as soon as a run logs), later ones at most every
  ``every_s`` seconds, and what is pending is written ``every_s`` after it came even if nothing
  follows (a background timer), on ``flush(force=True)`` and on ``close``; a local file is a
  plain append-mode file. Same interface as a text stream (``write``, ``flush``, ``close``).
  """

  def __init__(self, path: str, every_s: float = 30.0):
    import threading
    import time
    self.path = path
    self._clock = time.monotonic
    if is_uri(path):
      p = epath.Path(path)
      self._text = [p.read_text()] if p.exists() else []
      self._local = None
      self._every, self._last = every_s, float("-inf")
      self._lock, self._timer, self._dirty = threading.Lock(), None, False
    else:
      self._local = open(path, "a")

  def write(self, text: str) -> int:
    if self._local is not None:
      return self._local.write(text)
    with self._lock:
      self._text.append(text)
      self._dirty = True
    return len(text)

  def flush(self, force: bool = False) -> None:
    if self._local is not None:
      self._local.flush()
      return
    import threading
    with self._lock:
      if not self._dirty:
        return
      wait = self._last + self._every - self._clock()
      if force or wait <= 0:
        epath.Path(self.path).write_text("".join(self._text))
        self._last, self._dirty = self._clock(), False
      elif self._timer is None:  # Written when the wait is over, even if nothing else comes.
        self._timer = threading.Timer(wait, self._flush_later)
        self._timer.daemon = True
        self._timer.start()

  def _flush_later(self) -> None:
    with self._lock:
      self._timer = None
    self.flush(force=True)

  def close(self) -> None:
    if self._local is not None:
      self._local.close()
      return
    with self._lock:
      if self._timer is not None:
        self._timer.cancel()
        self._timer = None
    self.flush(force=True)
