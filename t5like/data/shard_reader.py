"""The tf.data reader of one RedPajama / FLAN jsonl(.zst) shard (``jsonl_dataset``).

Python does the decompression and JSON parsing
(TensorFlow reads neither zstd nor JSON) in chunks of ``chunk_size`` lines: chunk ``i`` of a file is
a pure function of ``(path, i)``, so the iterator state is just tf.data counters and can be saved
and restored exactly. Reading stays linear in the data read: the stream left after chunk ``i`` is
kept open for chunk ``i + 1`` (up to ``$T5LIKE_OPEN_SHARDS`` streams, default 4096, enough for
every task file of FLAN, and no more than the open-file limit allows: a run raises that limit
once at its start, ``raise_open_file_limit``, and logs it), and the byte offset where each
chunk starts is remembered, so a stream that had to be closed reopens with a seek (plain jsonl)
instead of re-reading its prefix. Only a restored iterator reads a file's prefix again, once.
"""
from __future__ import annotations

import collections
import os
import threading
from typing import Any

import numpy as np
from etils import epy

from t5like.data import sources

with epy.lazy_imports():  # TensorFlow loads on first use.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top


def _soft_open_file_limit() -> int | None:
  """The process's soft limit on open files (None: unlimited or not POSIX)."""
  try:
    import resource  # pylint: disable=g-import-not-at-top
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
  except (ImportError, ValueError, OSError):
    return None
  return None if soft == resource.RLIM_INFINITY else int(soft)


def open_shards_wanted() -> int:
  """Shard streams the reader keeps open at most (``$T5LIKE_OPEN_SHARDS``, default 4096)."""
  return int(os.environ.get("T5LIKE_OPEN_SHARDS", "4096"))


def raise_open_file_limit(want: int | None = None) -> tuple[int, int] | None:
  """Raises the process's soft open-file limit to ``want`` (default: room for
  ``open_shards_wanted()`` streams plus 256), within the hard limit; ``(old, new)`` when it
  changed, else None. Called explicitly where a run starts (``PipelineData``, which logs it):
  reading never changes process limits, it keeps fewer streams open under a low limit."""
  want = want or open_shards_wanted() + 256
  try:
    import resource  # pylint: disable=g-import-not-at-top
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
      resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
      return int(soft), int(target)
  except (ImportError, ValueError, OSError):  # Not POSIX, or not allowed: keep the limit.
    pass
  return None


class _StreamCache:
  """LRU of open shard streams keyed by ``(path, next_chunk_index)``, plus the byte offset where
  recent chunks start (kept after their stream is closed, for a seek instead of a re-read)."""

  def __init__(self, capacity: int | None = None, offsets: int = 200_000) -> None:
    self._lock = threading.Lock()
    self._streams: collections.OrderedDict[tuple[str, int], Any] = collections.OrderedDict()
    self._offsets: collections.OrderedDict[tuple[str, int], int] = collections.OrderedDict()
    self._wanted = capacity or open_shards_wanted()
    self._max_offsets = offsets
    self.reopened = 0  # Streams opened again after eviction (seek, or prefix re-read for .zst).
    self.rescanned_lines = 0  # Lines read again to reach a chunk (restores, evicted .zst).

  def capacity(self) -> int:
    """Streams kept open: as many as wanted, within the open-file limit less 256 for the rest
    of the process (``raise_open_file_limit`` makes room at the start of a run)."""
    limit = _soft_open_file_limit()
    return self._wanted if limit is None else max(8, min(self._wanted, limit - 256))

  def pop(self, path: str, index: int):
    with self._lock:
      return self._streams.pop((path, index), None)

  def offset(self, path: str, index: int) -> int | None:
    with self._lock:
      return self._offsets.get((path, index))

  def put(self, path: str, index: int, stream, offset: int | None = None) -> None:
    with self._lock:
      if offset is not None:
        self._offsets[(path, index)] = offset
        self._offsets.move_to_end((path, index))
        while len(self._offsets) > self._max_offsets:
          self._offsets.popitem(last=False)
      old = self._streams.pop((path, index), None)
      self._streams[(path, index)] = stream
      evicted = []
      while len(self._streams) > self.capacity():
        evicted.append(self._streams.popitem(last=False)[1])
    for s in evicted + ([old] if old is not None else []):
      s.close()


_CACHE = _StreamCache()


def _open_at(path: str, index: int, chunk_size: int):
  """A stream positioned at chunk ``index``: a seek if its offset is known, else skipped lines."""
  stream = sources.open_binary(path)
  if index == 0:
    return stream
  _CACHE.reopened += 1
  offset = _CACHE.offset(path, index)
  if offset is not None and not path.endswith(".zst"):
    stream.seek(offset)
    return stream
  if offset is not None:  # zstd cannot seek: decompress the prefix, skipping whole blocks.
    while offset > 0:
      got = len(stream.read(min(offset, 1 << 22)))
      if not got:
        break
      offset -= got
    return stream
  for _ in range(index * chunk_size):  # A restored iterator: the prefix is read once.
    _CACHE.rescanned_lines += 1
    if not stream.readline():
      break
  return stream


def read_chunk(path: str, index: int, schema: sources.RecordSchema, *, policy: str, label: str,
               chunk_size: int, max_lines: int | None = None
               ) -> tuple[bool, list[list[bytes]]]:
  """Reads lines ``[index*chunk_size, (index+1)*chunk_size)`` of a shard, parsed and checked.

  Returns ``(done, columns)``: ``done`` is True when the chunk starts past the end of the file;
  ``columns`` holds one list of encoded values per schema field (good records only). With
  ``max_lines``, chunks past that line are empty and the stream is closed once it is reached.
  """
  if max_lines is not None and index * chunk_size >= max_lines:
    return True, [[] for _ in schema.fields]
  stream = _CACHE.pop(path, index)
  if stream is None:
    stream = _open_at(path, index, chunk_size)
  stats = sources.RecordStats()  # Added to the source's counts and to this file's (caching).
  columns: list[list[bytes]] = [[] for _ in schema.fields]
  n_lines = 0
  for n_lines in range(1, chunk_size + 1):
    line = stream.readline()
    if not line:
      n_lines -= 1
      break
    record, bad = sources.parse_record(line, schema)
    if bad:
      sources.handle_bad(path, index * chunk_size + n_lines, bad, policy, stats)
    elif record is not None:
      stats.add("ok")
      for col, name in zip(columns, schema.fields):
        col.append(record[name])
  sources.stats_for(label).merge(stats)
  sources.stats_for(f"{label}@{path}").merge(stats)
  if n_lines == chunk_size and (max_lines is None or (index + 1) * chunk_size < max_lines):
    _CACHE.put(path, index + 1, stream, offset=stream.tell())
  else:
    stream.close()
  return n_lines == 0, columns


def jsonl_dataset(filename: tf.Tensor, schema: sources.RecordSchema, *, policy: str, label: str,
                  chunk_size: int = 256, max_lines: int | None = None) -> tf.data.Dataset:
  """tf.data reader of one jsonl(.zst) shard: a dataset of ``{field: tf.string}`` records.

  Checkpointable: the state is the chunk counter plus the position inside the current chunk; the
  py_function is a pure function of its inputs (set the dataset option
  ``experimental_external_state_policy=IGNORE`` before saving an iterator, as `pipeline` does).
  """
  fields = schema.fields

  def _py_read(path: tf.Tensor, index: tf.Tensor):
    done, columns = read_chunk(path.numpy().decode("utf-8"), int(index.numpy()), schema,
                               policy=policy, label=label, chunk_size=chunk_size,
                               max_lines=max_lines)
    return [np.bool_(done)] + [np.array(c, dtype=object) for c in columns]

  def _read(index: tf.Tensor):
    out = tf.py_function(_py_read, [filename, index], [tf.bool] + [tf.string] * len(fields))
    done = tf.ensure_shape(out[0], [])
    return done, {name: tf.ensure_shape(col, [None]) for name, col in zip(fields, out[1:])}

  ds = tf.data.Dataset.counter().map(_read)
  ds = ds.take_while(lambda done, _: tf.logical_not(done))
  return ds.map(lambda _, record: record).unbatch()
