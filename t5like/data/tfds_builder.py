"""Local TFDS builders that convert jsonl(.zst) corpora into TFDS datasets once (no download).

* ``t5like_redpajama/<subset>`` (one builder config per RedPajama-V1 subset): feature ``text``;
  split ``train`` from ``manual_dir/<subset>/*.jsonl[.zst]``, split ``validation`` from
  ``validation_dir/<subset>/`` when given.
* ``t5like_flan/part00`` .. ``part15`` (`FLAN_PARTS` builder configs): features ``inputs, targets,
  task_name, task_source, template_type``. A task belongs to part ``crc32(task_key) % FLAN_PARTS``
  (stable across machines and runs); each part holds one split per task and split of its tasks,
  named ``<task_key>-train`` / ``<task_key>-validation``, and its task rows (sub-mixtures, split
  names) in its metadata, so a converted corpus can be read (e.g. from a bucket) without its jsonl
  files. `prepare_flan` converts the parts one after another, each on Beam when given pipeline
  options (`python -m t5like.tools.prepare_data`); every part is built, an empty one too, so a
  complete conversion has all of them.

Records go through `sources.iter_records` (same checks and bad-record policy as the raw path);
the counts of skipped records and a fingerprint of the source files (a FLAN part: its own files)
land in ``metadata.json``.
TFDS stores examples in a fixed order given by a hash of their keys (file, line); readers then
shuffle files and examples with a seed.
Once prepared, ``tfds.load(name, data_dir=...)`` and ``seqio.TfdsDataSource`` read the dataset.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
import zlib
from typing import Any, Iterator, Mapping, Sequence

import tensorflow as tf
import tensorflow_datasets as tfds
from etils import epath

from t5like.data import sources

VERSION = "1.0.0"
REDPAJAMA_NAME = "t5like_redpajama"
FLAN_NAME = "t5like_flan"
FLAN_PARTS = 16  # Changing it re-partitions the tasks: existing conversions must be rebuilt.
FLAN_PART_NAMES = tuple(f"part{i:02d}" for i in range(FLAN_PARTS))


def task_key(task: str) -> str:
  """A TFDS-safe split prefix for a task name (``[A-Za-z0-9_]``)."""
  return re.sub(r"\W", "_", task)


def flan_part(key: str) -> str:
  """The ``t5like_flan`` config holding a task, from its `task_key` (stable across runs)."""
  return FLAN_PART_NAMES[zlib.crc32(key.encode("utf-8")) % FLAN_PARTS]


def fingerprint(files: Sequence[str], policy: str) -> str:
  """Hash of the source files (path, size, mtime) and the policy: changes when the data does."""
  h = hashlib.sha256(policy.encode())
  for path in sorted(files):
    st = tf.io.gfile.stat(path)
    h.update(f"{path}\0{st.length}\0{st.mtime_nsec}\n".encode())
  return h.hexdigest()[:16]


class _LocalInfo(tfds.core.DatasetInfo):
  """A converted corpus's info: nothing to look up in TFDS's public bucket (which TFDS does for a
  builder not yet prepared, after making a temporary directory it never removes)."""

  def initialize_from_bucket(self) -> None:
    return None


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
    self._beam_counts = ""  # Set by `_build` for a Beam conversion: where workers' counts go.
    self._bad_counts: dict[str, dict[str, int]] = {}
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return _LocalInfo(
        builder=self,
        description="Converted by t5like from a jsonl(.zst) corpus.",
        features=tfds.features.FeaturesDict(
            {name: tfds.features.Text() for name in self.SCHEMA.fields}),
        metadata=tfds.core.MetadataDict(),
    )

  def _examples(self, split: str, files: Sequence[str], extra: dict[str, bytes] | None = None):
    """The split's ``(key, record)`` examples: a generator, or on Beam a ``PTransform`` reading
    one file per element (its counts written to ``_beam_counts``, read back by `_build`)."""
    if self._beam_counts:
      return _beam_examples(split, files, self.SCHEMA, self._policy, extra, self._beam_counts)
    return self._python_examples(split, files, extra)

  def _python_examples(self, split: str, files: Sequence[str],
                       extra: dict[str, bytes] | None) -> Iterator[tuple[str, dict[str, bytes]]]:
    stats = sources.RecordStats()
    for file_index, path in enumerate(files):
      yield from _file_examples(file_index, path, self.SCHEMA, self._policy, extra, stats)
    self._bad_counts[split] = stats.as_dict()
    self.info.metadata["records"] = self._bad_counts


def _file_examples(file_index: int, path: str, schema: sources.RecordSchema, policy: str,
                   extra: dict[str, bytes] | None, stats: sources.RecordStats):
  for lineno, record in sources.iter_records(path, schema, policy=policy, stats=stats):
    if extra:
      record = {**record, **{k: v for k, v in extra.items() if not record.get(k)}}
    yield f"{file_index:06d}:{lineno:09d}", record


def _beam_file(item: tuple[int, str], schema, policy, extra):
  import apache_beam as beam  # pylint: disable=g-import-not-at-top
  stats = sources.RecordStats()
  yield from _file_examples(item[0], item[1], schema, policy, extra, stats)
  yield beam.pvalue.TaggedOutput("counts", stats.as_dict())


def _sum_counts(counts: Sequence[dict[str, int]]) -> dict[str, int]:
  total: dict[str, int] = {}
  for c in counts:
    for k, v in c.items():
      total[k] = total.get(k, 0) + v
  return total


def _write_counts(counts: dict[str, int], path: str) -> None:
  with tf.io.gfile.GFile(path, "w") as f:
    json.dump(counts, f)


def _beam_examples(split: str, files: Sequence[str], schema, policy: str,
                   extra: dict[str, bytes] | None, counts_dir: str):
  """A ``PTransform`` of a split's examples on Beam: one element per file, the good/bad record
  counts summed into ``<counts_dir>/<split>.json`` (TFDS metadata is written by the driver)."""
  import apache_beam as beam  # pylint: disable=g-import-not-at-top

  def expand(root):
    out = (root | f"files_{split}" >> beam.Create(list(enumerate(files)))
           | f"spread_{split}" >> beam.Reshuffle()
           | f"read_{split}" >> beam.FlatMap(_beam_file, schema, policy, extra).with_outputs(
               "counts", main="examples"))
    _ = (out.counts | f"sum_{split}" >> beam.CombineGlobally(_sum_counts)
         | f"write_counts_{split}" >> beam.Map(
             _write_counts, os.path.join(counts_dir, f"{split}.json")))
    return out.examples
  return beam.ptransform_fn(expand)()  # pylint: disable=no-value-for-parameter


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
    return self._examples(split, files)


class T5likeFlan(_JsonlBuilder):
  """One part of a FLAN-layout corpus: one split per task and split; its task rows in metadata."""

  SCHEMA = sources.FLAN_SCHEMA
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=p) for p in FLAN_PART_NAMES]

  def __init__(self, *, tasks: Sequence[sources.FlanTaskFiles] | None = None,
               **kwargs: Any) -> None:
    self._tasks = tasks  # This part's tasks (listed from manual_dir when None).
    super().__init__(**kwargs)

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    root = os.fspath(dl_manager.manual_dir)
    part = self.builder_config.name
    tasks = self._tasks
    if tasks is None:
      tasks = _flan_parts(sources.flan_tasks(root), root).get(part, [])
    keys = [task_key(t.task) for t in tasks]
    self.info.metadata["source"] = {"root": root, "part": part, "parts": FLAN_PARTS}
    self.info.metadata["fingerprint"] = _flan_fingerprint(tasks, self._policy)
    self.info.metadata["tasks"] = [
        {"submixture": t.submixture, "task": t.task, "key": k,
         "splits": {split: f"{k}-{split}" for split, _ in t.splits}}
        for t, k in zip(tasks, keys)]
    self.info.metadata["records"] = {}  # Stays empty for a part without tasks.
    gens = {}
    for t, k in zip(tasks, keys):
      for split, path in t.splits:
        gens[f"{k}-{split}"] = self._generate_examples(
            split=f"{k}-{split}", files=[path], task=t.task)
    return gens

  def _generate_examples(self, split: str, files: Sequence[str], task: str):
    return self._examples(split, files, extra={"task_name": task.encode("utf-8")})


def _flan_parts(tasks: Sequence[sources.FlanTaskFiles], root: str
                ) -> dict[str, list[sources.FlanTaskFiles]]:
  """Tasks grouped by `flan_part`; refuses task names that collide after `task_key`."""
  keys = [task_key(t.task) for t in tasks]
  if len(set(keys)) != len(keys):
    raise ValueError(f"FLAN task names under {root} collide after sanitising: {sorted(keys)}")
  parts: dict[str, list[sources.FlanTaskFiles]] = {}
  for t, k in zip(tasks, keys):
    parts.setdefault(flan_part(k), []).append(t)
  return parts


def _flan_fingerprint(tasks: Sequence[sources.FlanTaskFiles], policy: str) -> str:
  return fingerprint([p for t in tasks for _, p in t.splits], policy)


def _is_built(builder: _JsonlBuilder, root: str, expected: str) -> bool:
  """Whether ``builder`` is built; raises if it was built from other files than ``root``'s."""
  if not tf.io.gfile.exists(os.path.join(builder.data_dir, "dataset_info.json")):
    return False
  found = builder.info.metadata.get("fingerprint")
  if expected and found and found != expected:
    raise ValueError(
        f"{builder.data_dir} holds a TFDS conversion of other data (fingerprint {found}, "
        f"source {builder.info.metadata.get('source')}) than {root} (fingerprint {expected}); "
        "delete that directory or set data.tfds_data_dir elsewhere")
  return True


def _build(builder: _JsonlBuilder, root: str,
           beam_options: Sequence[str] | None = None) -> _JsonlBuilder:
  """Builds in this process, or on Beam with ``beam_options`` (pipeline flags; [] = the local
  DirectRunner): TFDS runs the PTransforms of `_beam_examples`, then the workers' record counts
  are put in the dataset's metadata."""
  options = None
  if beam_options is not None:
    from apache_beam.options.pipeline_options import PipelineOptions  # pylint: disable=g-import-not-at-top
    options = PipelineOptions(list(beam_options))
    builder._beam_counts = os.path.join(  # pylint: disable=protected-access
        os.path.dirname(os.fspath(builder.data_dir)), f".records-{uuid.uuid4().hex}")
    tf.io.gfile.makedirs(builder._beam_counts)  # pylint: disable=protected-access
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
      manual_dir=root, compute_stats=tfds.download.ComputeStatsMode.SKIP, beam_options=options,
      download_mode=tfds.download.GenerateMode.REUSE_DATASET_IF_EXISTS))
  if options is not None:
    counts_dir = builder._beam_counts  # pylint: disable=protected-access
    records = {}
    for split in builder.info.splits:
      with tf.io.gfile.GFile(os.path.join(counts_dir, f"{split}.json")) as f:
        records[split] = json.load(f)
    builder.info.metadata["records"] = records
    builder.info.write_to_directory(builder.data_dir)
    tf.io.gfile.rmtree(counts_dir)
  return builder


def _prepare(builder: _JsonlBuilder, root: str, expected: str,
             beam_options: Sequence[str] | None = None) -> _JsonlBuilder:
  """Builds ``builder`` from ``root`` unless already built from the same files."""
  if _is_built(builder, root, expected):
    return builder
  if not root:
    raise sources.LayoutError(
        f"no TFDS conversion at {builder.data_dir} and no jsonl corpus root to build it from; "
        "set data.data_dir to the corpus root")
  return _build(builder, root, beam_options)


def prepare_redpajama(root: str, data_dir: str, *, subsets: Sequence[str] | None = None,
                      validation_dir: str = "", policy: str = "skip",
                      beam_options: Sequence[str] | None = None
                      ) -> dict[str, T5likeRedpajama]:
  """Converts (once) each RedPajama subset under ``root`` into ``t5like_redpajama/<subset>``
  (on Beam with ``beam_options``: one element per file, a pipeline per subset).

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
    out[subset] = _prepare(builder, root, expected, beam_options)
  if not out:
    raise sources.LayoutError(f"no converted RedPajama subset in {data_dir} and no root given")
  return out


def prepare_flan(root: str, data_dir: str, *, policy: str = "skip",
                 beam_options: Sequence[str] | None = None) -> dict[str, T5likeFlan]:
  """Converts (once) a FLAN-layout corpus into the parts of ``t5like_flan``; {part: builder}.

  Parts not yet built are built (on Beam with ``beam_options``: one element per task file); a
  part built from other files raises before anything is built. ``root=""`` opens a complete
  conversion.
  """
  flan_dir = os.path.join(data_dir, FLAN_NAME)
  if not root:
    missing = [p for p in FLAN_PART_NAMES if not tf.io.gfile.exists(
        os.path.join(flan_dir, p, VERSION, "dataset_info.json"))]
    if len(missing) == FLAN_PARTS:
      raise sources.LayoutError(
          f"no TFDS conversion of a FLAN corpus at {flan_dir} and no jsonl corpus root to build "
          "it from; set data.data_dir to the corpus root")
    if missing:
      raise sources.LayoutError(
          f"the FLAN conversion at {flan_dir} lacks parts {', '.join(missing)} (an interrupted "
          "conversion?); convert again from the corpus root")
    return {p: T5likeFlan(config=p, data_dir=data_dir) for p in FLAN_PART_NAMES}
  by_part = _flan_parts(sources.flan_tasks(root), root)
  todo = [p for p in FLAN_PART_NAMES if not _is_built(
      T5likeFlan(config=p, data_dir=data_dir, policy=policy), root,
      _flan_fingerprint(by_part.get(p, []), policy))]
  for part in todo:  # An empty part is quick in this process; the others on Beam if asked.
    tasks = by_part.get(part, [])
    _build(T5likeFlan(config=part, data_dir=data_dir, policy=policy, tasks=tasks), root,
           beam_options if tasks else None)
  return {p: T5likeFlan(config=p, data_dir=data_dir, policy=policy) for p in FLAN_PART_NAMES}


def flan_task_table(builders: Mapping[str, T5likeFlan]) -> list[dict[str, Any]]:
  """Rows of every part, sorted as `sources.flan_tasks`: ``{"submixture", "task", "key", "part",
  "tfds_name" (the part's dataset), "splits": {split: tfds_split}, "sizes": {split: n}}``."""
  table = []
  for part, builder in builders.items():
    for row in json.loads(json.dumps(builder.info.metadata["tasks"])):
      row["part"] = part
      row["tfds_name"] = f"{FLAN_NAME}/{part}:{VERSION}"
      row["sizes"] = {s: builder.info.splits[name].num_examples
                      for s, name in row["splits"].items()}
      table.append(row)
  return sorted(table, key=lambda row: (row["submixture"], row["task"]))
