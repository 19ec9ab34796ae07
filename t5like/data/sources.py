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

The tf.data reader of one shard is `t5like.data.shard_reader`.
"""
from __future__ import annotations

import collections
import dataclasses
import io
import json
import os
import threading
from typing import Iterator

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

  def merge(self, other: "RecordStats") -> None:
    counts = other.as_dict()
    with self._lock:
      self._counts.update(counts)

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


def open_binary(path: str) -> io.BufferedIOBase:
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
  with open_binary(path) as f:
    for lineno, line in enumerate(f, start=1):
      record, bad = parse_record(line, schema)
      if bad:
        handle_bad(path, lineno, bad, policy, stats)
      elif record is not None:
        if stats is not None:
          stats.add("ok")
        yield lineno, record


def handle_bad(path: str, lineno: int, kind: str, policy: str, stats: RecordStats | None) -> None:
  if policy == "error":
    raise BadRecordError(
        f"{path}:{lineno}: bad record ({kind.replace('_', ' ')}); set data.bad_records='skip' to "
        "count and skip such records")
  if stats is not None:
    stats.add(kind)


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
