"""Record counts for mixing rates, cached per corpus under ``$T5LIKE_CACHE`` and shared by hosts.

FLAN's examples-proportional rates need the number of good records of every task's train file
(thousands of files). Counting parses every file, so the counts are kept in
``$T5LIKE_CACHE/counts/<corpus dir name>-<hash of its resolved path>.json`` (default
``~/.cache/t5like``), one entry per file with the file's size and modification time: an entry is
reused only while both match, so a changed or replaced file is counted again and the cache
rewritten. Nothing is ever written into the corpus, which may be read-only or shared; a
``<corpus root>/.t5like_counts.json`` left by an older version is still read. Hosts share the
counts when ``T5LIKE_CACHE`` is a path they all see (e.g. ``gs://bucket/t5like_cache``); count once
before a multi-host run with ``python -m t5like.tools.prepare_data --data_dir <root>``, or
train from a cache (``data.cache_dir``): its Beam run counted every file (`caching`).

The file is rewritten whole through a temporary name and a rename, so a reader never sees half a
cache; two hosts counting at once write the same numbers.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import os
import threading
from typing import Sequence

from etils import epy

from t5like.data import sources

with epy.lazy_imports():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

log = logging.getLogger("t5like.data")

CACHE_NAME = ".t5like_counts.json"
FORMAT = 1


def cache_path(root: str) -> str:
  """Where the counts of the corpus at ``root`` are cached (keyed by its resolved path)."""
  from t5like import paths  # pylint: disable=g-import-not-at-top
  cache = os.environ.get("T5LIKE_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "t5like"))
  resolved = paths.resolve(root).rstrip("/")
  digest = hashlib.sha256(resolved.encode()).hexdigest()[:12]
  name = "".join(c if c.isalnum() or c in "-_." else "_" for c in os.path.basename(resolved))
  return f"{cache.rstrip('/')}/counts/{name or 'root'}-{digest}.json"


def _schema_key(schema: sources.RecordSchema) -> str:
  return ",".join(schema.required)


def _load(path: str) -> dict:
  try:
    with tf.io.gfile.GFile(path, "r") as f:
      data = json.load(f)
    return data if data.get("format") == FORMAT else {}
  except (tf.errors.NotFoundError, ValueError, OSError):
    return {}


def _write(path: str, data: dict) -> bool:
  tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
  try:
    tf.io.gfile.makedirs(os.path.dirname(path))
    with tf.io.gfile.GFile(tmp, "w") as f:
      json.dump(data, f, sort_keys=True)
    tf.io.gfile.rename(tmp, path, overwrite=True)
    return True
  except (tf.errors.OpError, OSError):
    return False


def _count_one(path: str, schema: sources.RecordSchema) -> tuple[int, int]:
  return count_records([path], schema)


class CorpusCounts:
  """Good-record counts of the files under ``root``, from the cache file or counted once."""

  def __init__(self, root: str, schema: sources.RecordSchema, threads: int = 8) -> None:
    self.root = root
    self.schema = schema
    self.threads = threads
    self._lock = threading.Lock()
    self._counts: dict[str, tuple[int, int]] | None = None
    self.counted = 0  # Files counted (not found up to date in the cache) by this object.
    self.cache_path = ""

  def _entries(self, files: Sequence[str]) -> dict[str, tuple[int, int]]:
    legacy = os.path.join(self.root, CACHE_NAME)  # Read if present; never written.
    cached = cache_path(self.root)
    data = _load(cached) or _load(legacy)
    entries = data.get("files", {})
    key = _schema_key(self.schema)
    out, todo, stats = {}, [], {}
    for path in files:
      st = tf.io.gfile.stat(path)
      stats[path] = (int(st.length), int(st.mtime_nsec))
      rel = os.path.relpath(path, self.root) if not path.startswith("gs://") else (
          path[len(self.root.rstrip("/")) + 1:])
      e = entries.get(rel, {}).get(key)
      if e and (e["size"], e["mtime_ns"]) == stats[path]:
        out[path] = (int(e["records"]), int(e["bytes"]))
      else:
        todo.append((rel, path))
    if todo:
      log.info("counting records of %d file(s) under %s for mixing rates", len(todo), self.root)
      with concurrent.futures.ThreadPoolExecutor(self.threads) as pool:
        counted = list(pool.map(lambda rp: _count_one(rp[1], self.schema), todo))
      for (rel, path), (n, nbytes) in zip(todo, counted):
        out[path] = (n, nbytes)
        size, mtime = stats[path]
        entries.setdefault(rel, {})[key] = {"size": size, "mtime_ns": mtime, "records": n,
                                            "bytes": nbytes}
      self.counted += len(todo)
      data = {"format": FORMAT, "files": entries}
      self.cache_path = cached if _write(cached, data) else ""
      if not self.cache_path:
        log.warning("could not write the record counts cache %s (set T5LIKE_CACHE to a "
                    "writable directory): the counts will be recomputed next time", cached)
    else:
      self.cache_path = cached if tf.io.gfile.exists(cached) else legacy
    return out

  def count(self, files: Sequence[str]) -> tuple[int, int]:
    """``(good records, bytes of the first field)`` summed over ``files``."""
    with self._lock:
      if self._counts is None or any(f not in self._counts for f in files):
        self._counts = {**(self._counts or {}), **self._entries(self._all_files(files))}
      return (sum(self._counts[f][0] for f in files), sum(self._counts[f][1] for f in files))

  def _all_files(self, files: Sequence[str]) -> list[str]:
    """Every countable file of the corpus (one pass, one cache write), plus ``files``."""
    try:
      if self.schema == sources.FLAN_SCHEMA:
        found = [p for t in sources.flan_tasks(self.root) for s, p in t.splits if s == "train"]
      else:
        found = [p for fs in sources.redpajama_subsets(self.root).values() for p in fs]
    except sources.LayoutError:
      found = []
    return list(dict.fromkeys(found + list(files)))


# ---------------------------------------------------------------------------------------------
# Counting in this process (no cache file), cached per file version.

_COUNT_CACHE: dict[tuple[str, int, int, sources.RecordSchema], tuple[int, int]] = {}


def _file_key(path: str) -> tuple[str, int, int]:
  st = tf.io.gfile.stat(path)
  return path, int(st.length), int(st.mtime_nsec)


def count_records(files: Sequence[str], schema: sources.RecordSchema) -> tuple[int, int]:
  """``(good records, UTF-8 bytes of the first field)`` over ``files``; cached per file version."""
  total_n = total_bytes = 0
  for path in files:
    key = _file_key(path) + (schema,)
    if key not in _COUNT_CACHE:
      n = nbytes = 0
      for _, record in sources.iter_records(path, schema, policy="skip"):
        n += 1
        nbytes += len(record[schema.fields[0]])
      _COUNT_CACHE[key] = (n, nbytes)
    n, nbytes = _COUNT_CACHE[key]
    total_n += n
    total_bytes += nbytes
  return total_n, total_bytes


def estimate_tokens(files: Sequence[str], vocab_path: str = "",
                    sample_bytes: int = 1 << 20) -> float:
  """Token count of the ``text`` of ``files``: exact bytes times tokens/byte of a leading sample."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top

  from t5like.data import vocab as vocab_lib  # pylint: disable=g-import-not-at-top

  _, total_bytes = count_records(files, sources.TEXT_SCHEMA)
  sp = spm.SentencePieceProcessor(model_proto=vocab_lib.load_model_proto(vocab_path))
  texts, seen = [], 0
  for path in files:
    for _, record in sources.iter_records(path, sources.TEXT_SCHEMA, policy="skip"):
      texts.append(record["text"].decode("utf-8"))
      seen += len(record["text"])
      if seen >= sample_bytes:
        break
    if seen >= sample_bytes:
      break
  if not seen:
    return 0.0
  tokens = sum(len(ids) for ids in sp.encode(texts))
  return total_bytes * tokens / seen
