"""Cached corpora: seqio's offline cache of the tokenised documents, shared by every objective.

Every RedPajama / FLAN task (`task_common.make_task`) carries a ``seqio.CacheDatasetPlaceholder``
right after tokenisation (`with_placeholder`). What runs before it (read + check the jsonl
records, the validation hold-out, seqio ``tokenize`` with the task's vocabulary) is what a cache
holds; what runs after it stays on the fly, seeded as without a cache: the EOS and chunking
(stream / document), the prefix split (middle / random), span corruption and UL2's denoisers,
FLAN's ``append_eos_after_trim``, trimming, the example shuffle, mixing, packing.

Layout (``python -m t5like.tools.cache_data`` builds it, on Beam): ``<cache_dir>/<part>/`` per
corpus part (``embedded_redpajama.c4``, ``flan.<sub>.<task>``; no objective suffix, so the causal,
prefix and denoising tasks of a part read the same cache), in seqio's format (``<split>.tfrecord-
NNNNN-of-MMMMM``, ``info.<split>.json``, ``stats.<split>.json``, ``COMPLETED``) plus
``t5like_cache.json``: what the cache was built from (vocabulary hash, seqio version, source
files, bad-record policy, hold-out) and what was counted while building it (records good and
bad per split, FLAN's per-file good records for examples-proportional rates).

Order: source file ``i`` is cache shard ``i`` (a split with at least ``min_shards`` files), or
shards ``i*m .. i*m+m-1`` with its record ``k`` in shard ``i*m + k mod m`` (fewer files: ``m =
min_shards``, so that hosts read only their share, `host_shards`); it is read back in file order
with the source's own interleave, so a cached pipeline yields the same batches as the on-the-fly
one (same seed, any number of hosts, resumption included). `CorpusTask` reads it so.
A missing or stale cache is an error (`CacheError`) naming the command that builds it.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import uuid
from typing import Any, Iterable, Mapping

import seqio
import tensorflow as tf

from t5like.errors import UserError

FORMAT = 1
MANIFEST = "t5like_cache.json"
COMPLETED = "COMPLETED"


class CacheError(UserError, FileNotFoundError):
  """``data.cache_dir`` lacks a complete cache of a task, or holds one of other data."""


def with_placeholder(preprocessors: list) -> list:
  """``preprocessors`` with a ``CacheDatasetPlaceholder`` after seqio's ``tokenize`` step."""
  for i, prep in enumerate(preprocessors):
    if getattr(prep, "func", prep) is seqio.preprocessors.tokenize:
      return preprocessors[:i + 1] + [seqio.CacheDatasetPlaceholder()] + preprocessors[i + 1:]
  raise ValueError("no seqio tokenize step to cache after")


def cache_name(task_name: str) -> str:
  """The cache directory name of a task: its part name without the objective suffix."""
  return task_name.split(":", 1)[0]


def _file_source(source) -> seqio.FileDataSource:
  return getattr(source, "_base", source)  # validation.HoldoutSource wraps a FileDataSource.


class CorpusTask(seqio.Task):
  """A seqio Task whose cache is its part's (shared by the objectives) and is read with the
  interleave of its jsonl source, so that cached and on-the-fly examples come in one order."""

  @property
  def cache_dir(self) -> str | None:
    if not self._cache_dir:  # Else: seqio's global cache directories, by part name.
      for root in seqio.utils.get_global_cache_dirs():
        path = os.path.join(root, cache_name(self.name))
        if tf.io.gfile.exists(os.path.join(path, COMPLETED)):
          self._cache_dir = path
          break
    return self._cache_dir

  def preprocess_postcache(self, dataset, sequence_length, seed=None):
    # seqio moves the seed of the steps after a placeholder on by 42 per step before it; nothing
    # before it is random here, so undo that: the objectives draw what they drew before their
    # tasks were cacheable (a run started then resumes onto the same examples).
    if seed is not None and self.supports_caching:
      seed -= 42 * self._cache_step_idx
    return super().preprocess_postcache(dataset, sequence_length=sequence_length, seed=seed)

  def _get_cached_source(self, split: str, file_shuffle_buffer_size: int | None = None):
    from t5like.data import host_shards  # pylint: disable=g-import-not-at-top

    self.assert_cached()
    base = _file_source(self.source)
    per_file = (_CACHED.get(self.name) or {}).get("shards_per_file", {}).get(split, 1)
    return host_shards.CachedSource(
        cache_dir=self.cache_dir, split=split, per_file=per_file,
        cycle_length=base._cycle_length, block_length=base._block_length)  # pylint: disable=protected-access


# ---------------------------------------------------------------------------------------------
# What a cache is built from.


@functools.lru_cache(maxsize=8)
def vocabulary_sha256(vocab_path: str) -> str:
  from t5like.data import vocab  # pylint: disable=g-import-not-at-top
  return hashlib.sha256(vocab.load_model_proto(vocab_path)).hexdigest()


def _relative(path: str, roots: Iterable[str]) -> str:
  for root in roots:
    root = root.rstrip("/") + "/"
    if root != "/" and path.startswith(root):
      return path[len(root):]
  return path


def identity(spec, task: seqio.Task) -> dict[str, Any]:
  """What the cached examples of ``task`` depend on (compared when training from the cache)."""
  roots = [r for r in (spec.validation_root, spec.root) if r]
  reader = getattr(_file_source(task.source), "_reader", None)
  cap = getattr(reader, "keywords", {}).get("cap")
  return {
      "format": FORMAT, "part": cache_name(task.name), "seqio_version": seqio.__version__,
      "vocabulary_sha256": vocabulary_sha256(spec.vocab_path), "bad_records": spec.bad_records,
      "validation_holdout": spec.holdout, "cap_per_file": cap,
      "files": {split: [_relative(p, roots) for p in task.source.list_shards(split)]
                for split in task.splits},
  }


def build_command(spec) -> str:
  """The command that caches the corpus of ``spec`` (named by every `CacheError`)."""
  corpus = {"redpajama_v1": "redpajama"}.get(spec.name, spec.name)
  out = ["python -m t5like.tools.cache_data", f"--corpus {corpus}"]
  if spec.name in ("redpajama_v1", "flan"):
    out.append(f"--data_dir {spec.root}")
  for key, value, default in (
      ("validation_dir", spec.validation_root if spec.name == "redpajama_v1" else "", ""),
      ("vocab_path", spec.vocab_path, ""), ("bad_records", spec.bad_records, "skip"),
      ("validation_holdout", spec.holdout, 0.0), ("flan_grouping", spec.flan_grouping, "task"),
      ("flan_example_cap", spec.cap if spec.flan_grouping == "submixture" else 30_000, 30_000)):
    if value != default and (spec.kind == "flan" or not key.startswith("flan")):
      out.append(f"--config.data.{key}={value}")
  return " ".join(out) + " --output_dir <data.cache_dir>"


# ---------------------------------------------------------------------------------------------
# Training from a cache.

_CACHED: dict[str, dict[str, Any]] = {}  # seqio task name -> manifest of the cache it reads.


def load_manifest(path: str) -> dict[str, Any] | None:
  try:
    with tf.io.gfile.GFile(os.path.join(path, MANIFEST)) as f:
      return json.load(f)
  except (tf.errors.NotFoundError, ValueError):
    return None


def attach(task: seqio.Task, spec, root: str) -> None:
  """Points ``task`` at its cache under ``root`` after checking it is complete and built from
  the data and vocabulary ``spec`` reads; raises `CacheError` naming the build command."""
  path = os.path.join(root, cache_name(task.name))
  fix = f"build it with: {build_command(spec)}"
  if not tf.io.gfile.exists(os.path.join(path, COMPLETED)):
    raise CacheError(f"data.cache_dir={root} has no complete cache of {cache_name(task.name)} "
                     f"({path}/{COMPLETED} does not exist); {fix}")
  manifest = load_manifest(path)
  if manifest is None:
    raise CacheError(f"{path} has no readable {MANIFEST} (not a t5like cache?); {fix}")
  want = identity(spec, task)
  diff = [k for k in want if manifest.get("identity", {}).get(k) != want[k]]
  if diff:
    names = {"vocabulary_sha256": "another vocabulary", "seqio_version": "another seqio version",
             "files": "other source files"}
    what = ", ".join(names.get(k, k) for k in diff)
    details = "; ".join(f"{k}: cached {manifest.get('identity', {}).get(k)!r}, now {want[k]!r}"
                        for k in diff if k != "files")
    raise CacheError(f"the cache {path} was built from {what} than this run reads"
                     f"{' (' + details + ')' if details else ''}; rebuild it into another "
                     f"data.cache_dir: {build_command(spec)}")
  task._cache_dir = path  # pylint: disable=protected-access
  _CACHED[task.name] = manifest


def use_cache(data, leaves: list, spec_of_task, read_cache: bool = True) -> bool:
  """Whether the tasks ``leaves`` read ``data.cache_dir`` (each one's cache checked by `attach`;
  ``spec_of_task`` gives its registration spec, None for a task the user registered): a task
  without a complete cache of the same data is an error, never a fallback."""
  root = data.cache_dir
  if not root or not read_cache:
    for task in leaves:
      detach(task.name)
    return False
  if data.source != "jsonl":
    raise CacheError(
        f"data.cache_dir={root} holds caches tokenised from the jsonl corpus, but "
        f"data.source={data.source!r}; set data.source=jsonl (the cache replaces the TFDS "
        "conversion) or data.cache_dir=''")
  seqio.add_global_cache_dirs([root])  # seqio's own lookup, for tasks registered by the user.
  for task in leaves:
    spec = spec_of_task(task.name)
    if spec is not None:
      attach(task, spec, root)
    elif not task.supports_caching or not task.cache_dir:
      raise CacheError(
          f"data.cache_dir={root}: seqio task {task.name} has "
          f"{'no CacheDatasetPlaceholder' if not task.supports_caching else 'no complete cache'}"
          " there; cache it with seqio's cache_tasks_main or set data.cache_dir=''")
  return True


def cached_stats(task_name: str, split: str) -> dict[str, Any]:
  """Record counts of a cached task, counted when the cache was built."""
  return {"where": "cache", **_CACHED[task_name].get("records", {}).get(split, {})}


def cached_manifest(task_name: str) -> dict[str, Any] | None:
  """The manifest of the cache ``task_name`` reads in this process (None: read on the fly)."""
  return _CACHED.get(task_name)


def detach(task_name: str) -> None:
  _CACHED.pop(task_name, None)


# ---------------------------------------------------------------------------------------------
# Building a cache: one source file at a time (what each Beam worker runs), then the split's and
# the task's files. `t5like.tools.cache_data` distributes these steps; `build` runs them here.


@dataclasses.dataclass(frozen=True)
class ShardResult:
  task: str
  split: str
  index: int
  examples: int
  tokens: dict[str, int]
  max_tokens: dict[str, int]
  records: dict[str, int]  # Good and bad records read (RecordStats kinds).
  file_records: int | None  # FLAN: good records of the whole file (examples-proportional rates).
  features: dict[str, Any]  # seqio's cached feature info (shape, dtype).
  paths: tuple[str, ...]  # Its cache shards (one, or ``min_shards`` for a split of few files).


def shard_path(out_dir: str, split: str, index: int, num_shards: int) -> str:
  return f"{seqio.utils.get_cached_tfrecord_prefix(out_dir, split)}-{index:05d}-of-{num_shards:05d}"


def cache_shard(task: seqio.Task, spec, split: str, index: int, output_dir: str,
                min_shards: int = 1) -> ShardResult:
  """Tokenises source file ``index`` of ``task``'s ``split`` into its cache shards (one, or
  ``min_shards`` round robin if the split has fewer files; each written under a temporary name,
  then renamed: a retried worker leaves no half file)."""
  from t5like.data import counts, host_shards, sources  # pylint: disable=g-import-not-at-top

  files = task.source.list_shards(split)
  per_file = host_shards.shards_per_file(len(files), min_shards)
  label = f"{task.name}@{files[index]}"
  stats = sources.reset_stats(label)
  ds = task.source.get_dataset(split=split, shuffle=False,
                               shard_info=seqio.ShardInfo(index, len(files)))
  ds = task.preprocess_precache(ds)
  keys = [k for k in task.output_features if k in ds.element_spec]
  features = {k: {"shape": [None] + s.shape.as_list()[1:] if s.shape.rank else [],
                  "dtype": s.dtype.name} for k, s in ds.element_spec.items()}
  out_dir = os.path.join(output_dir, cache_name(task.name))
  tf.io.gfile.makedirs(out_dir)
  paths = [shard_path(out_dir, split, index * per_file + r, len(files) * per_file)
           for r in range(per_file)]
  tmps = [f"{path}.tmp-{uuid.uuid4().hex}" for path in paths]
  n, tokens, longest = 0, dict.fromkeys(keys, 0), dict.fromkeys(keys, 0)
  writers = [tf.io.TFRecordWriter(tmp) for tmp in tmps]
  for ex in ds.as_numpy_iterator():
    writers[n % per_file].write(seqio.dict_to_tfexample(ex).SerializeToString())
    n += 1
    for k in keys:
      tokens[k] += len(ex[k])
      longest[k] = max(longest[k], len(ex[k]))
  for writer, tmp, path in zip(writers, tmps, paths):
    writer.close()
    tf.io.gfile.rename(tmp, path, overwrite=True)
  file_records = None
  if spec.kind == "flan":
    reader = getattr(_file_source(task.source), "_reader", None)
    capped = getattr(reader, "keywords", {}).get("cap") is not None
    file_records = (counts.count_records([files[index]], sources.FLAN_SCHEMA)[0] if capped
                    else stats.as_dict()["ok"])
  return ShardResult(task.name, split, index, n, tokens, longest, stats.as_dict(), file_records,
                     features, tuple(paths))


def _write_json(path: str, data: Any) -> None:
  with tf.io.gfile.GFile(path, "w") as f:
    json.dump(data, f, indent=2, sort_keys=True)


def finish_split(output_dir: str, task_name: str, split: str,
                 shards: list[ShardResult]) -> dict[str, Any]:
  """Writes seqio's ``info.<split>.json`` and ``stats.<split>.json``; returns the split's counts."""
  shards = sorted(shards, key=lambda s: s.index)
  out_dir = os.path.join(output_dir, cache_name(task_name))
  _write_json(seqio.utils.get_cached_info_path(out_dir, split), {
      "num_shards": sum(len(s.paths) for s in shards), "features": shards[0].features,
      "seqio_version": seqio.__version__})
  stats: dict[str, Any] = {"examples": sum(s.examples for s in shards)}
  for k in shards[0].tokens:
    stats[f"{k}_tokens"] = sum(s.tokens[k] for s in shards)
    stats[f"{k}_max_tokens"] = max(s.max_tokens[k] for s in shards)
  _write_json(seqio.utils.get_cached_stats_path(out_dir, split), stats)
  records: dict[str, int] = {}
  for s in shards:
    for k, v in s.records.items():
      records[k] = records.get(k, 0) + v
  return {"split": split, "examples": stats["examples"], "records": records,
          "file_records": [s.file_records for s in shards], "per_file": len(shards[0].paths)}


def finish_task(output_dir: str, task_name: str, ident: Mapping[str, Any],
                splits: list[dict[str, Any]]) -> str:
  """Writes ``t5like_cache.json`` and then ``COMPLETED`` (the cache is usable from then on)."""
  out_dir = os.path.join(output_dir, cache_name(task_name))
  _write_json(os.path.join(out_dir, MANIFEST), {
      "identity": dict(ident),
      "records": {s["split"]: s["records"] for s in splits},
      "examples": {s["split"]: s["examples"] for s in splits},
      "file_records": {s["split"]: s["file_records"] for s in splits},
      "shards_per_file": {s["split"]: s.get("per_file", 1) for s in splits},
  })
  with tf.io.gfile.GFile(os.path.join(out_dir, COMPLETED), "w") as f:
    f.write("")
  return out_dir


def work_items(task: seqio.Task) -> list[tuple[str, str, int]]:
  """(task, split, source file index) for every source file of every split of ``task``."""
  return [(task.name, split, i) for split in task.splits
          for i in range(len(task.source.list_shards(split)))]


def build(spec, task_names: list[str], output_dir: str, min_shards: int = 1) -> list[str]:
  """Caches ``task_names`` (registered from ``spec``) here, one file after the other (what the
  Beam pipeline does in parallel); returns the task cache directories."""
  out = []
  for name in task_names:
    task = seqio.get_mixture_or_task(name)
    results: dict[str, list[ShardResult]] = {}
    for _, split, i in work_items(task):
      results.setdefault(split, []).append(
          cache_shard(task, spec, split, i, output_dir, min_shards))
    splits = [finish_split(output_dir, name, s, r) for s, r in results.items()]
    out.append(finish_task(output_dir, name, identity(spec, task), splits))
  return out
