"""Reading RedPajama-V1 and FLAN style jsonl shards: layouts, record checks and tf.data readers.

On-disk layouts (the real corpora and the embedded one share them):

  RedPajama V1: ``<root>/<subset>/*.jsonl`` or ``*.jsonl.zst``, one JSON object per line with a
    ``text`` field (and ``meta``); subset in arxiv, book, c4, common_crawl, github, stackexchange,
    wikipedia.
  FLAN: ``<root>/<submixture>/<task_name>/<split>.jsonl[.zst]``, split in train, validation;
    records ``{"inputs", "targets", "task_name", "task_source", "template_type"}``.

Every record goes through `parse_record`, which sorts bad lines into four kinds (invalid JSON,
missing field, empty text, invalid UTF-8); the policy "skip" counts them in a `RecordStats`, "error"
raises `BadRecordError` naming the file and line. A missing directory or an empty glob raises
`LayoutError` at once, naming the path and the expected layout.

`jsonl_dataset` is the tf.data reader of one shard. Python does the decompression and JSON parsing
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
import dataclasses
import io
import json
import os
import threading
from typing import Any, Iterator

import numpy as np
from etils import epy

from t5like.errors import UserError

with epy.lazy_imports():  # TensorFlow loads on first use: listing names stays cheap.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

REDPAJAMA_SUBSETS = ("arxiv", "book", "c4", "common_crawl", "github", "stackexchange", "wikipedia")
# Approximate token counts of RedPajama V1 in billions (docs/paper.md §3): the default mixing rates.
REDPAJAMA_TOKENS_B = {
    "common_crawl": 878.0, "c4": 175.0, "github": 59.0, "book": 26.0, "arxiv": 28.0,
    "wikipedia": 24.0, "stackexchange": 20.0,
}
FLAN_SPLITS = ("train", "validation")
SHARD_SUFFIXES = (".jsonl", ".jsonl.zst")
REDPAJAMA_LAYOUT = (
    "expected RedPajama-V1 layout <root>/<subset>/*.jsonl or *.jsonl.zst with subset in "
    f"{', '.join(REDPAJAMA_SUBSETS)}; one JSON object per line with a 'text' field")
FLAN_LAYOUT = (
    "expected FLAN layout <root>/<submixture>/<task_name>/<split>.jsonl[.zst] with split in "
    "train, validation; one JSON object per line with 'inputs' and 'targets' fields")
BAD_KINDS = ("invalid_json", "missing_field", "empty_text", "invalid_utf8")
POLICIES = ("skip", "error")


class LayoutError(UserError, FileNotFoundError):
  """A corpus directory or shard glob that does not exist; the message names the layout."""


class BadRecordError(UserError, ValueError):
  """A bad record under the "error" policy; the message names the file, line and kind."""


@dataclasses.dataclass(frozen=True)
class RecordSchema:
  """Which string fields a record yields and which must be present and non-empty."""

  fields: tuple[str, ...]  # Output fields, in order.
  required: tuple[str, ...]  # Fields that must be non-empty strings (else the record is bad).


TEXT_SCHEMA = RecordSchema(fields=("text",), required=("text",))
FLAN_SCHEMA = RecordSchema(
    fields=("inputs", "targets", "task_name", "task_source", "template_type"),
    required=("inputs", "targets"))


class RecordStats:
  """Thread-safe counts of good and bad records seen by this process for one source."""

  def __init__(self) -> None:
    self._lock = threading.Lock()
    self._counts = collections.Counter({k: 0 for k in ("ok",) + BAD_KINDS})

  def add(self, kind: str, n: int = 1) -> None:
    with self._lock:
      self._counts[kind] += n

  def as_dict(self) -> dict[str, int]:
    with self._lock:
      return dict(self._counts)

  @property
  def bad(self) -> int:
    with self._lock:
      return sum(self._counts[k] for k in BAD_KINDS)


_STATS: dict[str, RecordStats] = {}
_STATS_LOCK = threading.Lock()


def stats_for(label: str) -> RecordStats:
  """The process-wide `RecordStats` of source ``label`` (created on first use)."""
  with _STATS_LOCK:
    return _STATS.setdefault(label, RecordStats())


def reset_stats(label: str) -> RecordStats:
  """Starts the counts of source ``label`` afresh (done when a task is (re)registered)."""
  with _STATS_LOCK:
    _STATS[label] = RecordStats()
    return _STATS[label]


def parse_record(line: bytes, schema: RecordSchema) -> tuple[dict[str, bytes] | None, str | None]:
  """Parses one jsonl line; returns ``(record, None)``, ``(None, bad_kind)`` or ``(None, None)``.

  ``(None, None)`` means a blank line (ignored, not counted). Fields are returned UTF-8 encoded;
  optional fields missing from the record become ``b""`` and non-string ones their JSON text.
  """
  try:
    text = line.decode("utf-8")
  except UnicodeDecodeError:
    return None, "invalid_utf8"
  if not text.strip():
    return None, None
  try:
    obj = json.loads(text)
  except ValueError:
    return None, "invalid_json"
  if not isinstance(obj, dict):
    return None, "invalid_json"
  out = {}
  for name in schema.fields:
    value = obj.get(name)
    if name in schema.required:
      if not isinstance(value, str):
        return None, "missing_field"
      if not value.strip():
        return None, "empty_text"
    elif value is None:
      value = ""
    elif not isinstance(value, str):
      value = json.dumps(value, ensure_ascii=False)
    try:
      out[name] = value.encode("utf-8")
    except UnicodeEncodeError:  # Lone surrogates from "\ud800"-style escapes.
      return None, "invalid_utf8"
  return out, None


def _open_binary(path: str) -> io.BufferedIOBase:
  """Opens a shard for reading lines of bytes, decompressing ``.zst`` on the fly."""
  fh = tf.io.gfile.GFile(path, "rb")
  if not path.endswith(".zst"):
    return fh
  import zstandard  # pylint: disable=g-import-not-at-top

  reader = zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True)
  return io.BufferedReader(reader, buffer_size=1 << 16)  # Thousands may be open at once.


def iter_records(path: str, schema: RecordSchema, *, policy: str = "skip",
                 stats: RecordStats | None = None) -> Iterator[tuple[int, dict[str, bytes]]]:
  """Yields ``(line_number, record)`` for the good records of one shard (1-based line numbers)."""
  if policy not in POLICIES:
    raise ValueError(f"bad-record policy must be one of {POLICIES}, got {policy!r}")
  with _open_binary(path) as f:
    for lineno, line in enumerate(f, start=1):
      record, bad = parse_record(line, schema)
      if bad:
        _handle_bad(path, lineno, bad, policy, stats)
      elif record is not None:
        if stats is not None:
          stats.add("ok")
        yield lineno, record


def _handle_bad(path: str, lineno: int, kind: str, policy: str, stats: RecordStats | None) -> None:
  if policy == "error":
    raise BadRecordError(
        f"{path}:{lineno}: bad record ({kind.replace('_', ' ')}); set data.bad_records='skip' to "
        "count and skip such records")
  if stats is not None:
    stats.add(kind)


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
  stream = _open_binary(path)
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


def read_chunk(path: str, index: int, schema: RecordSchema, *, policy: str, label: str,
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
  stats = stats_for(label)
  columns: list[list[bytes]] = [[] for _ in schema.fields]
  n_lines = 0
  for n_lines in range(1, chunk_size + 1):
    line = stream.readline()
    if not line:
      n_lines -= 1
      break
    record, bad = parse_record(line, schema)
    if bad:
      _handle_bad(path, index * chunk_size + n_lines, bad, policy, stats)
    elif record is not None:
      stats.add("ok")
      for col, name in zip(columns, schema.fields):
        col.append(record[name])
  if n_lines == chunk_size and (max_lines is None or (index + 1) * chunk_size < max_lines):
    _CACHE.put(path, index + 1, stream, offset=stream.tell())
  else:
    stream.close()
  return n_lines == 0, columns


def jsonl_dataset(filename: tf.Tensor, schema: RecordSchema, *, policy: str, label: str,
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


# ---------------------------------------------------------------------------------------------
# Layout discovery.


def list_shards(directory: str, layout: str) -> list[str]:
  """Sorted ``*.jsonl`` and ``*.jsonl.zst`` files of ``directory``; raises `LayoutError` if none."""
  if not tf.io.gfile.isdir(directory):
    raise LayoutError(f"directory {directory} does not exist; {layout}")
  files = sorted(
      os.path.join(directory, name) for name in tf.io.gfile.listdir(directory)
      if name.endswith(SHARD_SUFFIXES))
  if not files:
    raise LayoutError(
        f"no *.jsonl or *.jsonl.zst shards in {directory} (glob {directory}/*.jsonl*); {layout}")
  return files


def redpajama_subsets(root: str) -> dict[str, list[str]]:
  """Subsets present under a RedPajama-V1 root, each with its shards; raises if there are none."""
  if not tf.io.gfile.isdir(root):
    raise LayoutError(f"RedPajama root {root} does not exist; {REDPAJAMA_LAYOUT}")
  present = [s for s in REDPAJAMA_SUBSETS if tf.io.gfile.isdir(os.path.join(root, s))]
  if not present:
    raise LayoutError(f"no subset directory ({', '.join(REDPAJAMA_SUBSETS)}) in {root}; "
                      f"{REDPAJAMA_LAYOUT}")
  return {s: list_shards(os.path.join(root, s), REDPAJAMA_LAYOUT) for s in present}


@dataclasses.dataclass(frozen=True)
class FlanTaskFiles:
  """One FLAN task on disk: its sub-mixture, name, and shard per split."""

  submixture: str
  task: str
  splits: tuple[tuple[str, str], ...]  # ((split, path), ...) for the splits present.


def flan_tasks(root: str) -> list[FlanTaskFiles]:
  """Tasks under a FLAN-layout root (sorted); raises `LayoutError` if there are none."""
  if not tf.io.gfile.isdir(root):
    raise LayoutError(f"FLAN root {root} does not exist; {FLAN_LAYOUT}")
  tasks = []
  for sub in sorted(tf.io.gfile.listdir(root)):
    sub = sub.rstrip("/")
    sub_dir = os.path.join(root, sub)
    if not tf.io.gfile.isdir(sub_dir):
      continue
    for task in sorted(tf.io.gfile.listdir(sub_dir)):
      task = task.rstrip("/")
      task_dir = os.path.join(sub_dir, task)
      if not tf.io.gfile.isdir(task_dir):
        continue
      splits = []
      for split in FLAN_SPLITS:
        for suffix in SHARD_SUFFIXES:
          path = os.path.join(task_dir, split + suffix)
          if tf.io.gfile.exists(path):
            splits.append((split, path))
            break
      if splits:
        tasks.append(FlanTaskFiles(sub, task, tuple(splits)))
  if not tasks:
    raise LayoutError(f"no task with train/validation shards under {root} (glob "
                      f"{root}/*/*/{{train,validation}}.jsonl*); {FLAN_LAYOUT}")
  return tasks
