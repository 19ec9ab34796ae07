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
FLAN registration lives in `flan_tasks.py`; what both share in `task_common.py`.
"""
from __future__ import annotations

import functools
import os
from typing import Any

from t5like.config.data import EMBEDDED_CORPORA, ON_DISK_CORPORA, _corpus_of
from t5like.data import counts, sources
from t5like.data import task_common as tc
from t5like.data.flan_tasks import register_flan
from t5like.data.task_common import CorpusSpec, default_tfds_dir, seqio_name  # noqa: F401 (API)
from t5like.errors import UserError

EMBEDDED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "embedded")
EMBEDDED_ROOTS = {
    "embedded_redpajama": (os.path.join(EMBEDDED_DIR, "redpajama"),
                           os.path.join(EMBEDDED_DIR, "redpajama_validation")),
    "embedded_flan": (os.path.join(EMBEDDED_DIR, "flan"), ""),
}


# (corpus name, variant) -> (spec, seqio task names, seqio mixture names).
_REGISTERED: dict[tuple[str, str], tuple[CorpusSpec, list[str], list[str]]] = {}


def _register_redpajama(spec: CorpusSpec) -> tuple[list[str], list[str]]:
  import seqio  # pylint: disable=g-import-not-at-top

  tasks, rate_fns = {}, {}
  if spec.source == "tfds":
    from t5like.data import tfds_builder  # pylint: disable=g-import-not-at-top

    builders = tfds_builder.prepare_redpajama(
        spec.root, tc.tfds_dir(spec), validation_dir=spec.validation_root, policy=spec.bad_records,
        subsets=_wanted_subsets(spec))
    for subset, builder in builders.items():
      name = seqio_name(f"{spec.name}.{subset}", spec.variant)
      splits = {s: s for s in builder.info.splits}
      tasks[subset] = tc.make_task(name, tc.tfds_source(
          f"{tfds_builder.REDPAJAMA_NAME}/{subset}:{tfds_builder.VERSION}", spec, splits), spec)
      tc.TASK_STATS[name] = functools.partial(tc.conversion_stats, builder.info.metadata, None)
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
      tasks[subset] = tc.make_task(
          name, tc.jsonl_source(split_files, sources.TEXT_SCHEMA, spec, label=name), spec)
      tc.TASK_STATS[name] = functools.partial(tc.live_stats, name)
      sources.reset_stats(name)
      rate_fns[subset] = functools.partial(
          lambda files, vocab, _: counts.estimate_tokens(files, vocab),
          present[subset], spec.vocab_path)
  overrides = tc.check_rate_keys(spec, list(sources.REDPAJAMA_SUBSETS))
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
      tc.TASK_STATS.pop(name, None)
    del _REGISTERED[key]
  register_fn = register_flan if spec.kind == "flan" else _register_redpajama
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
      flan_grouping=data.flan_grouping, extra_ids=data.extra_ids)


def cache_spec(corpus: str, data_dir: str = "", validation_dir: str = "", overrides=()):
  """The spec a cache of ``corpus`` ("redpajama", "flan", "embedded_*") is built for, with
  ``data.*`` overrides ("data.vocab_path=..."): its lm / it variant, the tokenised part that
  every objective shares."""
  from t5like.config import Config  # pylint: disable=g-import-not-at-top
  from t5like.config.schema import apply_overrides  # pylint: disable=g-import-not-at-top

  bad = [o for o in overrides if not o.startswith("data.")]
  if bad:
    raise UserError(f"a corpus cache takes only data.* settings (--config.data.*), got {bad}")
  cfg = Config()
  apply_overrides(cfg, list(overrides))
  name = {"redpajama": "redpajama_v1"}.get(corpus, corpus)
  cfg.data.mixture, cfg.data.data_dir, cfg.data.validation_dir = name, data_dir, validation_dir
  cfg.data.objective = "auto"
  if name in ("redpajama_v1", "flan") and not data_dir:
    raise UserError(f"--corpus {corpus} reads a corpus on disk: give --data_dir")
  cfg.data.validate()
  return spec_from_config(cfg, name, "it" if name.endswith("flan") else "lm")


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
                    bad_records=data.bad_records, chunking=data.pretrain_chunking,
                    extra_ids=data.extra_ids)
  task_name = seqio_name(spec.name, variant)
  key = (spec.name, variant)
  if key in _REGISTERED:
    if _REGISTERED[key][0] == spec and task_name in seqio.TaskRegistry.names():
      return task_name
    if task_name in seqio.TaskRegistry.names():
      seqio.TaskRegistry.remove(task_name)
    del _REGISTERED[key]
  files = sources.list_shards(directory, layout)
  source = tc.jsonl_source({"validation": files}, sources.TEXT_SCHEMA, spec, label=task_name)
  seqio.TaskRegistry.add_provider(task_name, tc.make_task(task_name, source, spec))
  tc.TASK_STATS[task_name] = functools.partial(tc.live_stats, task_name)
  sources.reset_stats(task_name)
  _REGISTERED[key] = (spec, [task_name], [])
  return task_name


def spec_of_task(seqio_task: str) -> CorpusSpec | None:
  """The registration spec behind a t5like seqio task (None: not registered by t5like)."""
  for spec, names, _ in _REGISTERED.values():
    if seqio_task in names:
      return spec
  return None


def task_stats(seqio_task: str, split: str = "train") -> dict[str, Any]:
  """Good/bad record counts of a task: read by this process (jsonl), kept at TFDS conversion,
  or counted when its cache was built (data.cache_dir)."""
  from t5like.data import caching  # pylint: disable=g-import-not-at-top

  if caching.cached_manifest(seqio_task) is not None:
    return caching.cached_stats(seqio_task, split)
  fn = tc.TASK_STATS.get(seqio_task)
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
