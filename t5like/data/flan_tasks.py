"""FLAN-style instruction corpora as seqio tasks and mixtures (``flan``, ``embedded_flan``).

Mixing is examples-proportional with a per-task cap (``data.flan_example_cap``), as in T5/FLAN.
``data.flan_grouping`` picks how many input pipelines that takes:

* ``"task"``: one seqio task per FLAN task (exact seqio mixing; per-task rates). Each pipeline
  costs ~0.5 s of tf.data tracing and ~15 MB, which is too much at FLAN's ~1.8k tasks.
* ``"submixture"``: one pipeline per sub-mixture (jsonl: its files interleaved, each capped;
  tfds: its tasks' splits concatenated per conversion part, each capped, the parts sampled);
  over an epoch each task still contributes min(#examples, cap), but a task above the cap repeats
  the same ``cap`` examples every epoch (jsonl: its first; tfds: the first in the conversion's
  order). Per-task rates can only be 0 (drop).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

from t5like.data import counts, shard_reader, sources
from t5like.data import task_common as tc


def register_flan(spec: tc.CorpusSpec) -> tuple[list[str], list[str]]:
  """Registers the tasks and mixtures of FLAN corpus ``spec``; (task names, mixture names)."""
  if spec.flan_grouping == "submixture":
    return (_register_grouped_tfds if spec.source == "tfds" else _register_grouped_jsonl)(spec)
  return _register_per_task(spec)


def _capped_reader(filename, *, cap: int, **kwargs):
  # Stop reading (and close the file) at the cap: an open stream per big task would pile up.
  return shard_reader.jsonl_dataset(filename, max_lines=cap, **kwargs).take(cap)


def _train_records(task_name: str, corpus_counts: counts.CorpusCounts, files: list[str]) -> int:
  """Good train records of a FLAN task: counted when its cache was built (data.cache_dir), else
  from its files."""
  from t5like.data import caching  # pylint: disable=g-import-not-at-top
  manifest = caching.cached_manifest(task_name)
  if manifest is not None:
    return int(manifest["records"]["train"]["ok"])
  return corpus_counts.count(files)[0]


def _capped_total(task_name: str, corpus_counts: counts.CorpusCounts, files: list[str],
                  cap: int) -> float:
  """Sum over a sub-mixture's train files of min(good records, cap), from its cache if read."""
  from t5like.data import caching  # pylint: disable=g-import-not-at-top
  manifest = caching.cached_manifest(task_name)
  per_file = (manifest["file_records"]["train"] if manifest is not None
              else [corpus_counts.count([f])[0] for f in files])
  return float(sum(min(n, cap) for n in per_file))


def _overrides_for_grouping(spec: tc.CorpusSpec, subs: set[str], tasks: set[str]
                            ) -> dict[str, float]:
  overrides = tc.check_rate_keys(spec, sorted(subs | tasks))
  bad = sorted(k for k, v in overrides.items() if k not in subs and v != 0)
  if bad:
    raise ValueError(f"data.mixture_rates gives tasks {bad} a rate other than 0; with "
                     "data.flan_grouping='submixture' tasks can only be dropped (0); use "
                     "data.flan_grouping='task' for per-task rates")
  return overrides


def _add_task(name: str, source, spec: tc.CorpusSpec, stats: Callable[[str], dict[str, Any]]):
  import seqio  # pylint: disable=g-import-not-at-top

  task = tc.make_task(name, source, spec)
  seqio.TaskRegistry.add_provider(name, task)
  tc.TASK_STATS[name] = stats
  return task


def _register_grouped_jsonl(spec: tc.CorpusSpec) -> tuple[list[str], list[str]]:
  """One seqio task per sub-mixture reading all its task files, 32 interleaved, one record each
  in turn, each file read up to the cap per epoch."""
  import seqio  # pylint: disable=g-import-not-at-top

  corpus_counts = counts.CorpusCounts(spec.root, sources.FLAN_SCHEMA)
  by_sub: dict[str, list[sources.FlanTaskFiles]] = {}
  for t in sources.flan_tasks(spec.root):
    by_sub.setdefault(t.submixture, []).append(t)
  overrides = _overrides_for_grouping(spec, set(by_sub),
                                      {t.task for ts in by_sub.values() for t in ts})
  names, entries = [], []
  for sub, ts in sorted(by_sub.items()):
    keep = [t for t in ts if overrides.get(t.task) != 0]
    split_files = {split: [p for t in keep for s, p in t.splits if s == split]
                   for split in sources.FLAN_SPLITS}
    split_files = {k: v for k, v in split_files.items() if v}
    if "train" not in split_files:
      continue
    name = f"{spec.name}.{tc.clean(sub)}"
    reader = functools.partial(_capped_reader, cap=spec.cap, schema=sources.FLAN_SCHEMA,
                               policy=spec.bad_records, label=name)
    src = seqio.FileDataSource(read_file_fn=reader, split_to_filepattern=split_files,
                               caching_permitted=True, block_length=1,
                               cycle_length=min(len(split_files["train"]), 32))
    task = _add_task(name, src, spec, functools.partial(tc.live_stats, name))
    sources.reset_stats(name)
    names.append(name)
    if overrides.get(sub) != 0:
      rate = overrides.get(sub)
      own = tc.memo(functools.partial(float, rate) if rate is not None else functools.partial(
          _capped_total, name, corpus_counts, split_files["train"], spec.cap))
      entries.append((task, tc.rate_fn(own)))
  if not entries:
    raise ValueError(f"every sub-mixture of {spec.name} has rate 0 in data.mixture_rates")
  seqio.MixtureRegistry.add_provider(spec.name, seqio.Mixture(spec.name, entries))
  return names, [spec.name]


def _summed_stats(parts: list[tuple[dict[str, Any], dict[str, list[str]]]],
                  split: str) -> dict[str, Any]:
  """Conversion-time record counts of a grouped task: the sum over its tasks' splits in every
  part, given as (part metadata, {split: [tfds split names]})."""
  total: dict[str, int] = {}
  for metadata, splits_by_name in parts:
    for tfds_split in splits_by_name.get(split, []):
      for key, n in metadata.get("records", {}).get(tfds_split, {}).items():
        total[key] = total.get(key, 0) + n
  return {"where": "tfds_conversion", **total}


def _register_grouped_tfds(spec: tc.CorpusSpec) -> tuple[list[str], list[str]]:
  """One seqio task per sub-mixture over every conversion part holding its tasks; in a part,
  a TFDS split expression concatenates the tasks' splits, each train split sliced to the cap
  (``"a-train[:cap]+b-train"``), and the parts are sampled in proportion to their capped sizes.
  """
  import seqio  # pylint: disable=g-import-not-at-top

  from t5like.data import tfds_builder  # pylint: disable=g-import-not-at-top
  from t5like.data.parts_source import PartsSource  # pylint: disable=g-import-not-at-top

  builders = tfds_builder.prepare_flan(spec.root, tc.tfds_dir(spec), policy=spec.bad_records)
  rows = tfds_builder.flan_task_table(builders)
  overrides = _overrides_for_grouping(spec, {r["submixture"] for r in rows},
                                      {r["task"] for r in rows})
  by_sub: dict[str, dict[str, list[dict[str, Any]]]] = {}
  for row in rows:
    if overrides.get(row["task"]) != 0:
      by_sub.setdefault(row["submixture"], {}).setdefault(row["part"], []).append(row)
  names, entries = [], []
  for sub, by_part in sorted(by_sub.items()):
    parts, weights, stats = [], {}, []
    for part, members in sorted(by_part.items()):
      # TFDS rejects a slice past a split's end: only splits above the cap are sliced.
      expr = {s: "+".join(r["splits"][s] + (f"[:{spec.cap}]" if s == "train" and
                                            r["sizes"][s] > spec.cap else "")
                          for r in members if s in r["splits"])
              for s in sources.FLAN_SPLITS}
      expr = {s: e for s, e in expr.items() if e}
      if "train" not in expr:
        continue
      parts.append(tc.tfds_source(members[0]["tfds_name"], spec, expr))
      for s in expr:  # Per split, one weight per part that has the split (their order).
        sizes = [r["sizes"][s] for r in members if s in r["sizes"]]
        weights.setdefault(s, []).append(
            float(sum(min(n, spec.cap) if s == "train" else n for n in sizes)))
      stats.append((builders[part].info.metadata,
                    {s: [r["splits"][s] for r in members if s in r["splits"]] for s in expr}))
    if not parts:
      continue
    name = f"{spec.name}.{tc.clean(sub)}"
    task = _add_task(name, PartsSource(parts, weights), spec,
                     functools.partial(_summed_stats, stats))
    names.append(name)
    if overrides.get(sub) != 0:
      entries.append((task, overrides.get(sub, sum(weights["train"]))))
  if not entries:
    raise ValueError(f"every sub-mixture of {spec.name} has rate 0 in data.mixture_rates")
  seqio.MixtureRegistry.add_provider(spec.name, seqio.Mixture(spec.name, entries))
  return names, [spec.name]


def _register_per_task(spec: tc.CorpusSpec) -> tuple[list[str], list[str]]:
  """One seqio task per FLAN task, ``<name>.<sub>.<task>``; mixtures per sub-mixture and whole."""
  import seqio  # pylint: disable=g-import-not-at-top

  rows = []  # (submixture, task, seqio source, train-count fn, stats fn)
  if spec.source == "tfds":
    from t5like.data import tfds_builder  # pylint: disable=g-import-not-at-top

    builders = tfds_builder.prepare_flan(spec.root, tc.tfds_dir(spec), policy=spec.bad_records)
    for row in tfds_builder.flan_task_table(builders):  # Each task reads its part's dataset.
      src = tc.tfds_source(row["tfds_name"], spec, row["splits"])
      count = functools.partial(lambda n: n, row["sizes"].get("train", 0))
      metadata = builders[row["part"]].info.metadata
      rows.append((row["submixture"], row["task"], src, count,
                   functools.partial(tc.conversion_stats, metadata, row["splits"])))
  else:
    corpus_counts = counts.CorpusCounts(spec.root, sources.FLAN_SCHEMA)
    for t in sources.flan_tasks(spec.root):
      split_files = {split: [path] for split, path in t.splits}
      label = f"{spec.name}.{tc.clean(t.submixture)}.{tc.clean(t.task)}"
      src = tc.jsonl_source(split_files, sources.FLAN_SCHEMA, spec, label=label)
      count = functools.partial(_train_records, label, corpus_counts,
                                split_files.get("train", []))
      rows.append((t.submixture, t.task, src, count, functools.partial(tc.live_stats, label)))
      sources.reset_stats(label)
  overrides = tc.check_rate_keys(spec, sorted({r[0] for r in rows} | {r[1] for r in rows}))
  task_names, by_sub = [], {}
  for sub, task_dir, src, count, stats in rows:
    name = f"{spec.name}.{tc.clean(sub)}.{tc.clean(task_dir)}"
    task = _add_task(name, src, spec, stats)
    task_names.append(name)
    rate = overrides.get(task_dir)
    if rate != 0:
      own = tc.memo(functools.partial(tc.capped, count, spec.cap) if rate is None
                    else functools.partial(float, rate))
      by_sub.setdefault(sub, []).append((task, own))
  mixtures, entries = [], []
  for sub, members in by_sub.items():
    name = f"{spec.name}.{tc.clean(sub)}"
    seqio.MixtureRegistry.add_provider(
        name, seqio.Mixture(name, [(t, tc.rate_fn(own)) for t, own in members]))
    mixtures.append(name)
    if overrides.get(sub) == 0:
      continue
    for task, own in members:
      if sub in overrides:  # The sub-mixture's total is fixed; its tasks share it as above.
        entries.append((task, functools.partial(tc.share, own, [o for _, o in members],
                                                overrides[sub])))
      else:
        entries.append((task, tc.rate_fn(own)))
  if not entries:
    raise ValueError(f"every task of {spec.name} has rate 0 in data.mixture_rates")
  seqio.MixtureRegistry.add_provider(spec.name, seqio.Mixture(spec.name, entries))
  return task_names, mixtures + [spec.name]
