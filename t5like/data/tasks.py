"""seqio task and mixture registry for RedPajama-style text and FLAN-style instruction corpora.

Names (``data.mixture``) form a hierarchy ``<corpus>[.<part>[.<task>]]``:

  embedded_redpajama, embedded_redpajama.<subset>     the embedded corpus; rates ∝ token counts
  redpajama_v1, redpajama_v1.<subset>                 ``data.data_dir``; rates = docs/paper.md §3 tokens
  embedded_flan, embedded_flan.<submixture>, embedded_flan.<submixture>.<task>
  flan, flan.<submixture>, flan.<submixture>.<task>   ``data.data_dir`` in FLAN layout

FLAN mixtures are examples-proportional with a per-task cap (``data.flan_example_cap``).
``data.mixture_rates`` overrides rates by subset, sub-mixture or task name (0 drops it).
A pretraining corpus is registered once per objective variant, as ``<name>:lm``,
``<name>:prefix_middle`` or ``<name>:prefix_random`` (the seqio names); FLAN names are the seqio
names. Registration is lazy (first `resolve`), idempotent, and redone when the settings change.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
from typing import Any, Callable

from t5like.config.data import EMBEDDED_CORPORA, ON_DISK_CORPORA, _corpus_of
from t5like.data import counts, sources

EMBEDDED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "embedded")
EMBEDDED_ROOTS = {
    "embedded_redpajama": (os.path.join(EMBEDDED_DIR, "redpajama"),
                           os.path.join(EMBEDDED_DIR, "redpajama_validation")),
    "embedded_flan": (os.path.join(EMBEDDED_DIR, "flan"), ""),
}


@dataclasses.dataclass(frozen=True)
class CorpusSpec:
  """Everything a registration depends on; a different spec re-registers the names."""

  kind: str  # "redpajama" (text) or "flan" (inputs/targets).
  name: str  # Corpus name, e.g. "embedded_redpajama" or "flan".
  root: str  # Corpus root in jsonl layout ("" = read an existing TFDS conversion only).
  validation_root: str = ""  # RedPajama held-out root ("" = no validation split).
  variant: str = "lm"  # Objective variant: "lm", "prefix_middle", "prefix_random" or "it".
  rates: tuple[tuple[str, float], ...] = ()  # Rate overrides (name, rate).
  rate_by_tokens: bool = False  # RedPajama: rates ∝ measured token counts instead of docs/paper.md §3.
  cap: int = 30_000  # FLAN examples-proportional cap.
  source: str = "jsonl"  # "jsonl" or "tfds".
  tfds_data_dir: str = ""  # TFDS conversion directory ("" = a cache directory per corpus).
  vocab_path: str = ""  # SentencePiece model ("" = embedded).
  shuffle_buffer_size: int = 1000  # Per-task example shuffle buffer.
  bad_records: str = "skip"  # "skip" or "error".
  chunking: str = "document"  # Pretraining chunking: "stream" or "document" (objectives.py).
  flan_grouping: str = "task"  # FLAN: one seqio task per "task" or per "submixture" (jsonl).
  holdout: float = 0.0  # Validation hold-out fraction for parts without validation files.


# (corpus name, variant) -> (spec, seqio task names, seqio mixture names).
_REGISTERED: dict[tuple[str, str], tuple[CorpusSpec, list[str], list[str]]] = {}
# seqio task name -> callable(split) returning its good/bad record counts.
_TASK_STATS: dict[str, Callable[[str], dict[str, Any]]] = {}


def seqio_name(name: str, variant: str) -> str:
  """The registered seqio name of a user-facing name under an objective variant."""
  return name if variant == "it" else f"{name}:{variant}"


def default_tfds_dir(name: str, root: str) -> str:
  cache = os.environ.get("T5LIKE_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "t5like"))
  from t5like import paths  # pylint: disable=g-import-not-at-top
  digest = hashlib.sha256(paths.resolve(root).encode()).hexdigest()[:8] if root else "noroot"
  return os.path.join(cache, "tfds", f"{name}-{digest}")


def _vocabulary(path: str):
  from t5like.data import vocab  # pylint: disable=g-import-not-at-top

  return _cached_vocabulary(str(vocab.resolve_vocab_path(path)))


@functools.lru_cache(maxsize=8)
def _cached_vocabulary(path: str):
  import seqio  # pylint: disable=g-import-not-at-top

  return seqio.SentencePieceVocabulary(path)


def _check_rate_keys(spec: CorpusSpec, valid: list[str]) -> dict[str, float]:
  rates = dict(spec.rates)
  unknown = sorted(set(rates) - set(valid))
  if unknown:
    raise ValueError(f"data.mixture_rates has names {unknown} that are not parts of {spec.name}; "
                     f"valid names: {', '.join(sorted(valid))}")
  return rates


def _make_task(name: str, source, spec: CorpusSpec):
  import seqio  # pylint: disable=g-import-not-at-top

  from t5like.data import objectives  # pylint: disable=g-import-not-at-top
  from t5like.data import validation  # pylint: disable=g-import-not-at-top

  source = validation.with_holdout(source, spec.holdout,
                                   "inputs" if spec.kind == "flan" else "text")
  vocabulary = _vocabulary(spec.vocab_path)
  if spec.kind == "flan":
    features = objectives.output_features(vocabulary, ("inputs", "targets"), add_eos=True)
    preps = objectives.instruction_preprocessors()
  else:
    keys = ("targets",) if spec.variant == "lm" else ("inputs", "targets")
    features = objectives.output_features(vocabulary, keys, add_eos=False)
    preps = objectives.pretraining_preprocessors(spec.variant, spec.chunking)
  return seqio.Task(name, source=source, output_features=features, preprocessors=preps,
                    shuffle_buffer_size=spec.shuffle_buffer_size)


def _jsonl_source(split_files: dict[str, list[str]], schema, spec: CorpusSpec, label: str):
  import seqio  # pylint: disable=g-import-not-at-top

  reader = functools.partial(sources.jsonl_dataset, schema=schema, policy=spec.bad_records,
                             label=label)
  return seqio.FileDataSource(read_file_fn=reader, split_to_filepattern=split_files,
                              caching_permitted=False)


def _tfds_source(tfds_name: str, spec: CorpusSpec, splits: dict[str, str]):
  import seqio  # pylint: disable=g-import-not-at-top

  return seqio.TfdsDataSource(tfds_name=tfds_name, tfds_data_dir=_tfds_dir(spec), splits=splits,
                              caching_permitted=False, read_only=True)


def _tfds_dir(spec: CorpusSpec) -> str:
  return spec.tfds_data_dir or default_tfds_dir(spec.name, spec.root)


def _register_redpajama(spec: CorpusSpec) -> tuple[list[str], list[str]]:
  import seqio  # pylint: disable=g-import-not-at-top

  tasks, rate_fns = {}, {}
  if spec.source == "tfds":
    from t5like.data import tfds_builder  # pylint: disable=g-import-not-at-top

    builders = tfds_builder.prepare_redpajama(
        spec.root, _tfds_dir(spec), validation_dir=spec.validation_root, policy=spec.bad_records,
        subsets=_wanted_subsets(spec))
    for subset, builder in builders.items():
      name = seqio_name(f"{spec.name}.{subset}", spec.variant)
      splits = {s: s for s in builder.info.splits}
      tasks[subset] = _make_task(name, _tfds_source(
          f"{tfds_builder.REDPAJAMA_NAME}/{subset}:{tfds_builder.VERSION}", spec, splits), spec)
      _TASK_STATS[name] = functools.partial(_conversion_stats, builder.info.metadata, None)
      if spec.rate_by_tokens:  # Token estimate from the jsonl files, else the TFRecord bytes.
        files = sources.redpajama_subsets(spec.root).get(subset) if spec.root else None
        rate_fns[subset] = (
            functools.partial(lambda f, v, _: counts.estimate_tokens(f, v), files,
                              spec.vocab_path) if files else
            functools.partial(lambda n, _: float(n), builder.info.splits["train"].num_bytes))
  else:
    present = sources.redpajama_subsets(spec.root)
    wanted = _wanted_subsets(spec, present=list(present))
    for subset in wanted:
      if subset not in present:
        raise sources.LayoutError(
            f"subset directory {os.path.join(spec.root, subset)} does not exist (its rate is "
            f"positive; set data.mixture_rates={{\"{subset}\": 0}} to drop it); "
            f"{sources.REDPAJAMA_LAYOUT}")
      split_files = {"train": present[subset]}
      if spec.validation_root:
        split_files["validation"] = sources.list_shards(
            os.path.join(spec.validation_root, subset), sources.REDPAJAMA_LAYOUT)
      name = seqio_name(f"{spec.name}.{subset}", spec.variant)
      tasks[subset] = _make_task(
          name, _jsonl_source(split_files, sources.TEXT_SCHEMA, spec, label=name), spec)
      _TASK_STATS[name] = functools.partial(_live_stats, name)
      sources.reset_stats(name)
      rate_fns[subset] = functools.partial(
          lambda files, vocab, _: counts.estimate_tokens(files, vocab),
          present[subset], spec.vocab_path)
  overrides = _check_rate_keys(spec, list(sources.REDPAJAMA_SUBSETS))
  for task in tasks.values():
    seqio.TaskRegistry.add_provider(task.name, task)
  entries = []
  for subset, task in tasks.items():
    if subset in overrides:
      rate = overrides[subset]
    elif spec.rate_by_tokens:
      rate = rate_fns[subset]
    else:
      rate = sources.REDPAJAMA_TOKENS_B[subset]
    if rate != 0:
      entries.append((task, rate))
  if not entries:
    raise ValueError(f"every subset of {spec.name} has rate 0 in data.mixture_rates")
  mixture = seqio_name(spec.name, spec.variant)
  seqio.MixtureRegistry.add_provider(mixture, seqio.Mixture(mixture, entries))
  return [t.name for t in tasks.values()], [mixture]


def _wanted_subsets(spec: CorpusSpec, present: list[str] | None = None) -> list[str] | None:
  """Subsets to register: those with a positive rate (embedded: those present)."""
  rates = dict(spec.rates)
  if spec.rate_by_tokens:  # Embedded-style: whatever is on disk, minus explicit zeros.
    return None if present is None else [s for s in present if rates.get(s, 1) != 0]
  return [s for s in sources.REDPAJAMA_SUBSETS if rates.get(s, 1) != 0]


def _capped_reader(filename, *, cap: int, **kwargs):
  # Stop reading (and close the file) at the cap: an open stream per big task would pile up.
  return sources.jsonl_dataset(filename, max_lines=cap, **kwargs).take(cap)


def _register_flan_grouped(spec: CorpusSpec) -> tuple[list[str], list[str]]:
  """One seqio task per sub-mixture reading all its task files (``flan_grouping="submixture"``).

  A pipeline per task costs ~1 s of tf.data tracing each at start-up (30 min for FLAN's ~1.8k
  tasks); here a sub-mixture's files are interleaved 32 at a time, one record each in turn, and
  each file gives at most ``cap`` records per epoch, so over an epoch every task contributes
  min(#examples, cap): examples-proportional mixing with a cap, as with one task each, except
  that a task above the cap repeats the same ``cap`` examples (its first) every epoch.
  """
  import seqio  # pylint: disable=g-import-not-at-top

  corpus_counts = counts.CorpusCounts(spec.root, sources.FLAN_SCHEMA)
  by_sub: dict[str, list[sources.FlanTaskFiles]] = {}
  for t in sources.flan_tasks(spec.root):
    by_sub.setdefault(t.submixture, []).append(t)
  overrides = _check_rate_keys(spec, sorted(set(by_sub) | {t.task for ts in by_sub.values()
                                                           for t in ts}))
  bad = sorted(k for k, v in overrides.items() if k not in by_sub and v != 0)
  if bad:
    raise ValueError(f"data.mixture_rates gives tasks {bad} a rate other than 0; with "
                     "data.flan_grouping='submixture' tasks can only be dropped (0); use "
                     "data.flan_grouping='task' for per-task rates")
  names, entries = [], []
  for sub, ts in sorted(by_sub.items()):
    keep = [t for t in ts if overrides.get(t.task) != 0]
    split_files = {split: [p for t in keep for s, p in t.splits if s == split]
                   for split in sources.FLAN_SPLITS}
    split_files = {k: v for k, v in split_files.items() if v}
    if "train" not in split_files:
      continue
    name = f"{spec.name}.{_clean(sub)}"
    reader = functools.partial(_capped_reader, cap=spec.cap, schema=sources.FLAN_SCHEMA,
                               policy=spec.bad_records, label=name)
    src = seqio.FileDataSource(read_file_fn=reader, split_to_filepattern=split_files,
                               caching_permitted=False, block_length=1,
                               cycle_length=min(len(split_files["train"]), 32))
    task = _make_task(name, src, spec)
    seqio.TaskRegistry.add_provider(name, task)
    _TASK_STATS[name] = functools.partial(_live_stats, name)
    sources.reset_stats(name)
    names.append(name)
    if overrides.get(sub) != 0:
      rate = overrides.get(sub)
      own = _memo(functools.partial(float, rate) if rate is not None else functools.partial(
          lambda fs: float(sum(min(corpus_counts.count([f])[0], spec.cap) for f in fs)),
          split_files["train"]))
      entries.append((task, _rate_fn(own)))
  if not entries:
    raise ValueError(f"every sub-mixture of {spec.name} has rate 0 in data.mixture_rates")
  seqio.MixtureRegistry.add_provider(spec.name, seqio.Mixture(spec.name, entries))
  return names, [spec.name]


def _register_flan(spec: CorpusSpec) -> tuple[list[str], list[str]]:
  import seqio  # pylint: disable=g-import-not-at-top

  if spec.flan_grouping == "submixture" and spec.source == "jsonl":
    return _register_flan_grouped(spec)
  rows = []  # (submixture, task, seqio source, train-count fn, stats fn)
  if spec.source == "tfds":
    from t5like.data import tfds_builder  # pylint: disable=g-import-not-at-top

    builders = tfds_builder.prepare_flan(spec.root, _tfds_dir(spec), policy=spec.bad_records)
    for row in tfds_builder.flan_task_table(builders):  # Each task reads its part's dataset.
      src = _tfds_source(row["tfds_name"], spec, row["splits"])
      count = functools.partial(lambda n: n, row["sizes"].get("train", 0))
      metadata = builders[row["part"]].info.metadata
      rows.append((row["submixture"], row["task"], src, count,
                   functools.partial(_conversion_stats, metadata, row["splits"])))
  else:
    corpus_counts = counts.CorpusCounts(spec.root, sources.FLAN_SCHEMA)
    for t in sources.flan_tasks(spec.root):
      split_files = {split: [path] for split, path in t.splits}
      label = f"{spec.name}.{_clean(t.submixture)}.{_clean(t.task)}"
      src = _jsonl_source(split_files, sources.FLAN_SCHEMA, spec, label=label)
      count = functools.partial(lambda f: corpus_counts.count(f)[0],
                                split_files.get("train", []))
      rows.append((t.submixture, t.task, src, count, functools.partial(_live_stats, label)))
      sources.reset_stats(label)
  overrides = _check_rate_keys(spec, sorted({r[0] for r in rows} | {r[1] for r in rows}))
  task_names, by_sub = [], {}
  for sub, task_dir, src, count, stats in rows:
    name = f"{spec.name}.{_clean(sub)}.{_clean(task_dir)}"
    task = _make_task(name, src, spec)
    seqio.TaskRegistry.add_provider(name, task)
    task_names.append(name)
    _TASK_STATS[name] = stats
    rate = overrides.get(task_dir)
    if rate != 0:
      own = _memo(functools.partial(_capped, count, spec.cap) if rate is None
                  else functools.partial(float, rate))
      by_sub.setdefault(sub, []).append((task, own))
  mixtures, entries = [], []
  for sub, members in by_sub.items():
    name = f"{spec.name}.{_clean(sub)}"
    seqio.MixtureRegistry.add_provider(
        name, seqio.Mixture(name, [(t, _rate_fn(own)) for t, own in members]))
    mixtures.append(name)
    if overrides.get(sub) == 0:
      continue
    for task, own in members:
      if sub in overrides:  # The sub-mixture's total is fixed; its tasks share it as above.
        entries.append((task, functools.partial(_share, own, [o for _, o in members],
                                                overrides[sub])))
      else:
        entries.append((task, _rate_fn(own)))
  if not entries:
    raise ValueError(f"every task of {spec.name} has rate 0 in data.mixture_rates")
  seqio.MixtureRegistry.add_provider(spec.name, seqio.Mixture(spec.name, entries))
  return task_names, mixtures + [spec.name]


def _live_stats(label: str, split: str) -> dict[str, Any]:
  del split  # One label per task: counts cover every split this process read.
  return {"where": "read", **sources.stats_for(label).as_dict()}


def _conversion_stats(metadata: dict[str, Any], split_map: dict[str, str] | None,
                      split: str) -> dict[str, Any]:
  tfds_split = split_map.get(split, split) if split_map else split
  return {"where": "tfds_conversion", **metadata.get("records", {}).get(tfds_split, {})}


def _capped(count: Callable[[], int], cap: int) -> float:
  """Examples-proportional rate with a cap (T5/FLAN): min(#train examples, cap)."""
  return float(min(count(), cap))


def _rate_fn(own: Callable[[], float]) -> Callable[[Any], float]:
  return lambda _task: own()


def _share(own: Callable[[], float], group: list[Callable[[], float]], total: float,
           _task: Any = None) -> float:
  return total * own() / max(sum(g() for g in group), 1e-12)


def _clean(name: str) -> str:
  return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


def _memo(fn: Callable[[], float]) -> Callable[[], float]:
  cache: list[float] = []

  def wrapped() -> float:
    if not cache:
      cache.append(fn())
    return cache[0]
  return wrapped


def register(spec: CorpusSpec) -> str:
  """Registers ``spec`` (idempotent; re-registers if its settings changed); returns its name."""
  import seqio  # pylint: disable=g-import-not-at-top

  key = (spec.name, spec.variant)
  if key in _REGISTERED:
    old, old_tasks, old_mixtures = _REGISTERED[key]
    if old == spec and all(m in seqio.MixtureRegistry.names() for m in old_mixtures):
      return seqio_name(spec.name, spec.variant)
    for name in old_mixtures:
      seqio.MixtureRegistry.remove(name)
    for name in old_tasks:
      seqio.TaskRegistry.remove(name)
      _TASK_STATS.pop(name, None)
    del _REGISTERED[key]
  register_fn = _register_flan if spec.kind == "flan" else _register_redpajama
  before = (set(seqio.TaskRegistry.names()), set(seqio.MixtureRegistry.names()))
  try:
    task_names, mixture_names = register_fn(spec)
  except Exception:  # Leave no half-registered corpus behind: a retry must start clean.
    for registry, old in zip((seqio.TaskRegistry, seqio.MixtureRegistry), before):
      for name in set(registry.names()) - old:
        registry.remove(name)
    raise
  _REGISTERED[key] = (spec, task_names, mixture_names)
  return seqio_name(spec.name, spec.variant)


def corpus_kind(name: str) -> str:
  """"redpajama", "flan", or "" (a name registered with seqio by the user)."""
  corpus = _corpus_of(name)
  return "" if not corpus else ("flan" if corpus.endswith("flan") else "redpajama")


def spec_from_config(cfg, name: str, variant: str) -> CorpusSpec:
  """The registration spec of corpus ``name`` ("embedded_redpajama", "flan", ...) under ``cfg``."""
  data = cfg.data
  corpus = _corpus_of(name)
  if corpus in EMBEDDED_CORPORA:
    root, validation_root = EMBEDDED_ROOTS[corpus]
  elif corpus in ON_DISK_CORPORA:
    root, validation_root = data.data_dir, data.validation_dir
  else:
    raise ValueError(f"{name!r} is not a t5like corpus name")
  kind = corpus_kind(corpus)
  return CorpusSpec(
      kind=kind, name=corpus, root=root,
      validation_root=validation_root if kind == "redpajama" else "",
      variant=variant, rates=tuple(sorted(data.mixture_rates.items())),
      rate_by_tokens=(corpus == "embedded_redpajama"), cap=data.flan_example_cap,
      source=data.source, tfds_data_dir=data.tfds_data_dir, vocab_path=data.vocab_path,
      shuffle_buffer_size=data.shuffle_buffer_size, bad_records=data.bad_records,
      chunking=data.pretrain_chunking, holdout=data.validation_holdout,
      flan_grouping=data.flan_grouping)


EXTRA_EVAL_PREFIX = "extra_eval_"


def register_extra_eval(cfg, name: str, directory: str, variant: str) -> str:
  """Registers ``directory`` (``*.jsonl[.zst]`` records with ``text``) as a validation-only task
  scored with the pretraining objective ``variant``; returns its seqio name (Paloma-style
  out-of-domain eval, ``data.extra_eval``)."""
  import seqio  # pylint: disable=g-import-not-at-top

  layout = (f"expected {directory}/*.jsonl[.zst] records with a 'text' field for "
            f"data.extra_eval[{name!r}]")
  data = cfg.data
  spec = CorpusSpec(kind="redpajama", name=EXTRA_EVAL_PREFIX + name, root=directory, variant=variant,
                    vocab_path=data.vocab_path, shuffle_buffer_size=data.shuffle_buffer_size,
                    bad_records=data.bad_records, chunking=data.pretrain_chunking)
  task_name = seqio_name(spec.name, variant)
  key = (spec.name, variant)
  if key in _REGISTERED:
    if _REGISTERED[key][0] == spec and task_name in seqio.TaskRegistry.names():
      return task_name
    if task_name in seqio.TaskRegistry.names():
      seqio.TaskRegistry.remove(task_name)
    del _REGISTERED[key]
  files = sources.list_shards(directory, layout)
  source = _jsonl_source({"validation": files}, sources.TEXT_SCHEMA, spec, label=task_name)
  seqio.TaskRegistry.add_provider(task_name, _make_task(task_name, source, spec))
  _TASK_STATS[task_name] = functools.partial(_live_stats, task_name)
  sources.reset_stats(task_name)
  _REGISTERED[key] = (spec, [task_name], [])
  return task_name


def task_stats(seqio_task: str, split: str = "train") -> dict[str, Any]:
  """Good/bad record counts of a task: read by this process (jsonl) or kept at TFDS conversion."""
  fn = _TASK_STATS.get(seqio_task)
  return fn(split) if fn else {}


def registered_names() -> list[str]:
  """User-facing names registered by t5like so far (seqio names without the variant suffix)."""
  out = set()
  for (_, _), (_, tasks, mixtures) in _REGISTERED.items():
    out.update(n.split(":", 1)[0] for n in tasks + mixtures)
  return sorted(out)


def list_names(include_seqio: bool = True) -> list[str]:
  """Every task/mixture name usable as ``data.mixture``: t5like's and other seqio registrations.

  The embedded corpora are always listed (they register on first use); on-disk corpora appear
  once registered (``redpajama_v1``/``flan`` and their parts, for the data_dir used).
  """
  names = set(registered_names()) | set(EMBEDDED_CORPORA)
  if include_seqio:
    import seqio  # pylint: disable=g-import-not-at-top

    names |= set(seqio.TaskRegistry.names()) | set(seqio.MixtureRegistry.names())
  return sorted(names)
