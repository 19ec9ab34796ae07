"""Local TFDS builders that convert jsonl(.zst) corpora into TFDS datasets once (no download).

* ``t5like_redpajama/<subset>`` (one builder config per RedPajama-V1 subset): feature ``text``;
  split ``train`` from ``manual_dir/<subset>/*.jsonl[.zst]``, split ``validation`` from
  ``validation_dir/<subset>/`` when given.
* ``t5like_flan``: features ``inputs, targets, task_name, task_source, template_type``; one split
  per task and split, named ``<task_key>-train`` / ``<task_key>-validation``; the task list (with
  sub-mixtures and example counts) is kept in the dataset's metadata, so a converted corpus can be
  read (e.g. from a bucket) without its jsonl files.

Records go through `sources.iter_records` (same checks and bad-record policy as the raw path);
the counts of skipped records and a fingerprint of the source files land in ``metadata.json``.
TFDS stores examples in a fixed order given by a hash of their keys (file, line); readers then
shuffle files and examples with a seed.
Once prepared, ``tfds.load(name, data_dir=...)`` and ``seqio.TfdsDataSource`` read the dataset.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any, Iterator, Sequence

import tensorflow as tf
import tensorflow_datasets as tfds
from etils import epath

from t5like.data import sources

VERSION = "1.0.0"
REDPAJAMA_NAME = "t5like_redpajama"
FLAN_NAME = "t5like_flan"


def task_key(task: str) -> str:
  """A TFDS-safe split prefix for a task name (``[A-Za-z0-9_]``)."""
  return re.sub(r"\W", "_", task)


def fingerprint(files: Sequence[str], policy: str) -> str:
  """Hash of the source files (path, size, mtime) and the policy: changes when the data does."""
  h = hashlib.sha256(policy.encode())
  for path in sorted(files):
    st = tf.io.gfile.stat(path)
    h.update(f"{path}\0{st.length}\0{st.mtime_nsec}\n".encode())
  return h.hexdigest()[:16]


class _JsonlBuilder(tfds.core.GeneratorBasedBuilder):
  """Shared parts: string features, metadata with bad-record counts, ordered examples."""

  VERSION = tfds.core.Version(VERSION)
  SCHEMA: sources.RecordSchema
  MANUAL_DOWNLOAD_INSTRUCTIONS = "Pass the corpus root as manual_dir (nothing is downloaded)."

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    # TFDS 4.9.10 resolves this through `importlib_resources` (not a dependency here) for
    # builders defined inside a package; the file itself is all it needs (checksums lookup).
    return epath.Path(__file__)

  def __init__(self, *, validation_dir: str = "", policy: str = "skip", **kwargs: Any) -> None:
    self._validation_dir = validation_dir
    self._policy = policy
    self._bad_counts: dict[str, dict[str, int]] = {}
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description="Converted by t5like from a jsonl(.zst) corpus.",
        features=tfds.features.FeaturesDict(
            {name: tfds.features.Text() for name in self.SCHEMA.fields}),
        metadata=tfds.core.MetadataDict(),
    )

  def _examples(self, split: str, files: Sequence[str], extra: dict[str, bytes] | None = None
                ) -> Iterator[tuple[str, dict[str, bytes]]]:
    stats = sources.RecordStats()
    for file_index, path in enumerate(files):
      for lineno, record in sources.iter_records(path, self.SCHEMA, policy=self._policy,
                                                 stats=stats):
        if extra:
          record = {**record, **{k: v for k, v in extra.items() if not record.get(k)}}
        yield f"{file_index:06d}:{lineno:09d}", record
    self._bad_counts[split] = stats.as_dict()
    self.info.metadata["records"] = self._bad_counts


class T5likeRedpajama(_JsonlBuilder):
  """RedPajama-V1 subset(s) converted from ``<manual_dir>/<subset>/*.jsonl[.zst]``."""

  SCHEMA = sources.TEXT_SCHEMA
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=s) for s in sources.REDPAJAMA_SUBSETS]

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    subset = self.builder_config.name
    root = os.fspath(dl_manager.manual_dir)
    splits = {"train": sources.list_shards(os.path.join(root, subset), sources.REDPAJAMA_LAYOUT)}
    if self._validation_dir:
      splits["validation"] = sources.list_shards(
          os.path.join(self._validation_dir, subset), sources.REDPAJAMA_LAYOUT)
    self.info.metadata["source"] = {"root": root, "validation_dir": self._validation_dir}
    self.info.metadata["fingerprint"] = fingerprint(sum(splits.values(), []), self._policy)
    return {split: self._generate_examples(split=split, files=files)
            for split, files in splits.items()}

  def _generate_examples(self, split: str, files: Sequence[str]):
    yield from self._examples(split, files)


class T5likeFlan(_JsonlBuilder):
  """A FLAN-layout corpus: one split per task and split; task list in the metadata."""

  SCHEMA = sources.FLAN_SCHEMA

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    root = os.fspath(dl_manager.manual_dir)
    tasks = sources.flan_tasks(root)
    keys = [task_key(t.task) for t in tasks]
    if len(set(keys)) != len(keys):
      raise ValueError(f"FLAN task names under {root} collide after sanitising: {sorted(keys)}")
    self.info.metadata["source"] = {"root": root}
    self.info.metadata["fingerprint"] = fingerprint(
        [p for t in tasks for _, p in t.splits], self._policy)
    self.info.metadata["tasks"] = [
        {"submixture": t.submixture, "task": t.task, "key": k,
         "splits": {split: f"{k}-{split}" for split, _ in t.splits}}
        for t, k in zip(tasks, keys)]
    gens = {}
    for t, k in zip(tasks, keys):
      for split, path in t.splits:
        gens[f"{k}-{split}"] = self._generate_examples(
            split=f"{k}-{split}", files=[path], task=t.task)
    return gens

  def _generate_examples(self, split: str, files: Sequence[str], task: str):
    yield from self._examples(split, files, extra={"task_name": task.encode("utf-8")})


def _prepare(builder: _JsonlBuilder, root: str, expected: str) -> _JsonlBuilder:
  """Builds ``builder`` from ``root`` unless already built from the same files."""
  info_path = os.path.join(builder.data_dir, "dataset_info.json")
  if tf.io.gfile.exists(info_path):
    found = builder.info.metadata.get("fingerprint")
    if expected and found and found != expected:
      raise ValueError(
          f"{builder.data_dir} holds a TFDS conversion of other data (fingerprint {found}, "
          f"source {builder.info.metadata.get('source')}) than {root} (fingerprint {expected}); "
          "delete that directory or set data.tfds_data_dir elsewhere")
    return builder
  if not root:
    raise sources.LayoutError(
        f"no TFDS conversion at {builder.data_dir} and no jsonl corpus root to build it from; "
        "set data.data_dir to the corpus root")
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
      manual_dir=root, compute_stats=tfds.download.ComputeStatsMode.SKIP,
      download_mode=tfds.download.GenerateMode.REUSE_DATASET_IF_EXISTS))
  return builder


def prepare_redpajama(root: str, data_dir: str, *, subsets: Sequence[str] | None = None,
                      validation_dir: str = "", policy: str = "skip"
                      ) -> dict[str, T5likeRedpajama]:
  """Converts (once) each RedPajama subset under ``root`` into ``t5like_redpajama/<subset>``.

  With ``root=""`` only already-converted subsets in ``data_dir`` are opened. Returns the builders
  (``builder.info.splits``, ``builder.info.metadata["records"]`` hold sizes and bad-record counts).
  """
  if root:
    present = sources.redpajama_subsets(root)
    subsets = list(subsets) if subsets is not None else list(present)
    missing = [s for s in subsets if s not in present]
    if missing:
      raise sources.LayoutError(
          f"subset directories {', '.join(os.path.join(root, s) for s in missing)} do not exist; "
          f"{sources.REDPAJAMA_LAYOUT}")
  elif subsets is None:
    subsets = [s for s in sources.REDPAJAMA_SUBSETS if tf.io.gfile.exists(
        os.path.join(data_dir, REDPAJAMA_NAME, s, VERSION, "dataset_info.json"))]
  out = {}
  for subset in subsets:
    builder = T5likeRedpajama(config=subset, data_dir=data_dir, validation_dir=validation_dir,
                              policy=policy)
    expected = ""
    if root:
      files = present[subset] + (sources.list_shards(os.path.join(validation_dir, subset),
                                                     sources.REDPAJAMA_LAYOUT)
                                 if validation_dir else [])
      expected = fingerprint(files, policy)
    out[subset] = _prepare(builder, root, expected)
  if not out:
    raise sources.LayoutError(f"no converted RedPajama subset in {data_dir} and no root given")
  return out


def prepare_flan(root: str, data_dir: str, *, policy: str = "skip") -> T5likeFlan:
  """Converts (once) a FLAN-layout corpus into ``t5like_flan``; ``root=""`` opens a conversion."""
  expected = ""
  if root:
    tasks = sources.flan_tasks(root)
    expected = fingerprint([p for t in tasks for _, p in t.splits], policy)
  return _prepare(T5likeFlan(data_dir=data_dir, policy=policy), root, expected)


def flan_task_table(builder: T5likeFlan) -> list[dict[str, Any]]:
  """``[{"submixture", "task", "key", "splits": {split: tfds_split}, "sizes": {split: n}}]``."""
  table = json.loads(json.dumps(builder.info.metadata["tasks"]))
  for row in table:
    row["sizes"] = {s: builder.info.splits[name].num_examples for s, name in row["splits"].items()}
  return table
