"""What every corpus registration shares: the spec, seqio sources and tasks, rates and statistics.

`tasks.py` registers RedPajama-style corpora and dispatches; `flan_tasks.py` registers FLAN-style
ones. Both build seqio tasks with `make_task` from a `CorpusSpec`.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
from typing import Any, Callable

from t5like.data import shard_reader, sources


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
  flan_grouping: str = "task"  # FLAN: one seqio task per "task" or per "submixture".
  holdout: float = 0.0  # Validation hold-out fraction for parts without validation files.
  extra_ids: int = 0  # Sentinel ids appended to the vocabulary (seqio extra_ids).
  denoiser: tuple = ()  # Denoising variants ("span", "ul2_<name>"): (mode, noise_density,
  #   mean_noise_span_length); mode "" = no mode token, "s" = UL2's prefix-LM denoiser.


# seqio task name -> callable(split) returning its good/bad record counts.
TASK_STATS: dict[str, Callable[[str], dict[str, Any]]] = {}


def seqio_name(name: str, variant: str) -> str:
  """The registered seqio name of a user-facing name under an objective variant."""
  return name if variant == "it" else f"{name}:{variant}"


def default_tfds_dir(name: str, root: str) -> str:
  cache = os.environ.get("T5LIKE_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "t5like"))
  from t5like import paths  # pylint: disable=g-import-not-at-top
  digest = hashlib.sha256(paths.resolve(root).encode()).hexdigest()[:8] if root else "noroot"
  return os.path.join(cache, "tfds", f"{name}-{digest}")


def tfds_dir(spec: CorpusSpec) -> str:
  return spec.tfds_data_dir or default_tfds_dir(spec.name, spec.root)


def _vocabulary(path: str, extra_ids: int = 0):
  from t5like.data import vocab  # pylint: disable=g-import-not-at-top

  return _cached_vocabulary(str(vocab.resolve_vocab_path(path)), extra_ids)


@functools.lru_cache(maxsize=8)
def _cached_vocabulary(path: str, extra_ids: int = 0):
  import seqio  # pylint: disable=g-import-not-at-top

  return seqio.SentencePieceVocabulary(path, extra_ids=extra_ids)


def check_rate_keys(spec: CorpusSpec, valid: list[str]) -> dict[str, float]:
  """``data.mixture_rates`` as a dict, after checking every key names a part of the corpus."""
  rates = dict(spec.rates)
  unknown = sorted(set(rates) - set(valid))
  if unknown:
    raise ValueError(f"data.mixture_rates has names {unknown} that are not parts of {spec.name}; "
                     f"valid names: {', '.join(sorted(valid))}")
  return rates


def make_task(name: str, source, spec: CorpusSpec):
  """A seqio task reading ``source`` with the spec's objective, vocabulary and hold-out."""
  import seqio  # pylint: disable=g-import-not-at-top

  from t5like.data import objectives  # pylint: disable=g-import-not-at-top
  from t5like.data import validation  # pylint: disable=g-import-not-at-top

  source = validation.with_holdout(source, spec.holdout,
                                   "inputs" if spec.kind == "flan" else "text")
  vocabulary = _vocabulary(spec.vocab_path, spec.extra_ids)
  if spec.kind == "flan":
    features = objectives.output_features(vocabulary, ("inputs", "targets"), add_eos=True)
    preps = objectives.instruction_preprocessors()
  elif spec.denoiser:
    from t5like.data import denoising  # pylint: disable=g-import-not-at-top

    features = objectives.output_features(vocabulary, ("inputs", "targets"), add_eos=True)
    preps = denoising.preprocessors(spec.denoiser, spec.chunking)  # EOS on both, as T5.
  else:
    keys = ("targets",) if spec.variant == "lm" else ("inputs", "targets")
    features = objectives.output_features(vocabulary, keys, add_eos=False)
    preps = objectives.pretraining_preprocessors(spec.variant, spec.chunking)
  from t5like.data import caching  # pylint: disable=g-import-not-at-top

  if source.caching_permitted:  # jsonl sources: cacheable after tokenisation (caching.py).
    preps = caching.with_placeholder(preps)
  return caching.CorpusTask(name, source=source, output_features=features, preprocessors=preps,
                            shuffle_buffer_size=spec.shuffle_buffer_size)


def jsonl_source(split_files: dict[str, list[str]], schema, spec: CorpusSpec, label: str):
  import seqio  # pylint: disable=g-import-not-at-top

  reader = functools.partial(shard_reader.jsonl_dataset, schema=schema, policy=spec.bad_records,
                             label=label)
  from t5like.data import host_shards  # pylint: disable=g-import-not-at-top

  return host_shards.JsonlSource(read_file_fn=reader, split_to_filepattern=split_files,
                                 caching_permitted=True)


def tfds_source(tfds_name: str, spec: CorpusSpec, splits: dict[str, str]):
  import seqio  # pylint: disable=g-import-not-at-top

  return seqio.TfdsDataSource(tfds_name=tfds_name, tfds_data_dir=tfds_dir(spec), splits=splits,
                              caching_permitted=False, read_only=True)


def live_stats(label: str, split: str) -> dict[str, Any]:
  del split  # One label per task: counts cover every split this process read.
  return {"where": "read", **sources.stats_for(label).as_dict()}


def conversion_stats(metadata: dict[str, Any], split_map: dict[str, str] | None,
                     split: str) -> dict[str, Any]:
  tfds_split = split_map.get(split, split) if split_map else split
  return {"where": "tfds_conversion", **metadata.get("records", {}).get(tfds_split, {})}


def capped(count: Callable[[], int], cap: int) -> float:
  """Examples-proportional rate with a cap (T5/FLAN): min(#train examples, cap)."""
  return float(min(count(), cap))


def rate_fn(own: Callable[[], float]) -> Callable[[Any], float]:
  return lambda _task: own()


def share(own: Callable[[], float], group: list[Callable[[], float]], total: float,
          _task: Any = None) -> float:
  return total * own() / max(sum(g() for g in group), 1e-12)


def clean(name: str) -> str:
  return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


def memo(fn: Callable[[], float]) -> Callable[[], float]:
  cache: list[float] = []

  def wrapped() -> float:
    if not cache:
      cache.append(fn())
    return cache[0]
  return wrapped
