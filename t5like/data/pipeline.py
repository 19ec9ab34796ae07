"""Batches for training and evaluation: seqio task/mixture -> converter -> batches, resumable.

    it = make_iterator(cfg, split="train", batch_size=per_host_rows,
                       shard_index=jax.process_index(), num_shards=jax.process_count())
    batch = next(it)          # dict[str, np.ndarray int32 [batch, length]]
    it.save(ckpt_dir)         # tf.train.Checkpoint of the tf.data iterator (as T5X does)
    it.restore(ckpt_dir)      # the next batches are exactly those an uninterrupted run gets

Determinism: files, examples and mixing are shuffled with ``data.seed`` and tf.data keeps its
deterministic order, so the same config, shard and seed give the same batches. Hosts read disjoint
shards (``seqio.ShardInfo``): whole files when there are at least as many files as hosts, else
every ``num_shards``-th record of each file (`host_shards`). Validation (``repeat=False``) reads
each task of a mixture once, in task order, and pads the last batch with all-zero rows (segment
0, loss weight 0); the held-out loss reads instead a fixed sample of every part of a mixture
(``held_out.py``).
"""
from __future__ import annotations

import atexit
import dataclasses
import functools
import json
import os
import pathlib
import tempfile
import weakref
from typing import Any, Iterator, Mapping

import numpy as np
from etils import epath

from t5like.config.data import DENOISING_OBJECTIVES
from t5like.data import features, tasks

def resolve_objective(cfg, mixture: str | None = None) -> str:
  """"causal", "prefix" or "inputs_targets" for ``mixture`` (default ``cfg.data.mixture``)."""
  name = mixture or cfg.data.mixture
  kind = tasks.corpus_kind(name)
  family, attention = cfg.model.family, cfg.model.decoder_attention
  objective = cfg.data.objective
  if name.startswith(tasks.EXTRA_EVAL_PREFIX):  # Extra eval sets: their registered variant.
    objective = "causal" if name.endswith(":lm") else "prefix"
  elif kind == "flan":
    objective = "inputs_targets"
  elif objective == "auto":
    if kind == "redpajama":
      objective = "prefix" if (family == "redllm" or attention == "prefix") else "causal"
    else:  # A user-registered seqio name: look at its output features.
      import seqio  # pylint: disable=g-import-not-at-top

      has_inputs = "inputs" in seqio.get_mixture_or_task(name).output_features
      objective = "inputs_targets" if (has_inputs or family == "redllm") else "causal"
  if objective in DENOISING_OBJECTIVES and kind != "redpajama":
    raise ValueError(f"data.objective={objective!r} corrupts plain text: it reads the RedPajama "
                     f"corpora (embedded_redpajama, redpajama_v1), not {name!r}")
  if objective == "causal" and family == "redllm":
    raise ValueError(
        "data.objective='causal' gives no encoder input; RedLLM needs 'prefix' (pretraining) or "
        "'inputs_targets' (instruction data)")
  if objective == "causal" and attention == "prefix":
    raise ValueError(
        "model.decoder_attention='prefix' needs a prefix (inputs/targets) objective; set "
        "data.objective='prefix' or 'auto', or model.decoder_attention='causal'")
  return objective


def task_feature_lengths(cfg, mixture: str | None = None) -> dict[str, int]:
  """seqio task feature lengths: {"targets": L} (causal) or {"inputs": I, "targets": T}."""
  if resolve_objective(cfg, mixture) == "causal":
    return {"targets": cfg.data.sequence_length}
  return {"inputs": cfg.data.inputs_length, "targets": cfg.data.targets_length}


def model_feature_lengths(cfg, mixture: str | None = None) -> dict[str, int]:
  """Model feature name -> row length of the batches `make_iterator` yields."""
  lengths = task_feature_lengths(cfg, mixture)
  return features.model_feature_lengths(cfg.model.family, lengths, "inputs" in lengths)


def resolve_mixture(cfg, mixture: str | None = None) -> str:
  """Registers what ``mixture`` (default ``cfg.data.mixture``) needs; returns its seqio name."""
  import seqio  # pylint: disable=g-import-not-at-top

  name = mixture or cfg.data.mixture
  kind = tasks.corpus_kind(name)
  if not kind:
    if seqio.get_mixture_or_task(name) is None:  # Raises with close matches.
      raise ValueError(f"{name!r} is not registered with seqio")
    return name
  name = name.split(":", 1)[0]  # A t5like name, without any objective suffix.
  objective = resolve_objective(cfg, name)
  if objective in DENOISING_OBJECTIVES:
    from t5like.data import denoise_tasks  # pylint: disable=g-import-not-at-top
    return denoise_tasks.register(cfg, name)
  variant = ("it" if kind == "flan" else
             "lm" if objective == "causal" else f"prefix_{cfg.data.prefix_split}")
  corpus = name.split(".", 1)[0]
  tasks.register(tasks.spec_from_config(cfg, corpus, variant))
  full = tasks.seqio_name(name, variant)
  if full not in seqio.TaskRegistry.names() and full not in seqio.MixtureRegistry.names():
    raise ValueError(f"{name!r} is not a part of {corpus}; available: "
                     f"{', '.join(n for n in tasks.registered_names() if n.startswith(corpus))}")
  return full


def extra_eval_mixtures(cfg) -> dict[str, str]:
  """``data.extra_eval`` name -> registered seqio task (scored with the pretraining objective)."""
  family, attention = cfg.model.family, cfg.model.decoder_attention
  variant = ("lm" if family == "decllm" and attention == "causal"
             else f"prefix_{cfg.data.prefix_split}")
  return {name: tasks.register_extra_eval(cfg, name, directory, variant)
          for name, directory in sorted(cfg.data.extra_eval.items())}


def list_task_names() -> list[str]:
  """Names usable as ``data.mixture`` (t5like corpora registered so far + other seqio names)."""
  return tasks.list_names()


def _fingerprint(cfg, *, split: str, batch_size: int, shard_index: int, num_shards: int,
                 shuffle: bool, repeat: bool, mixture: str) -> dict[str, Any]:
  """What a saved iterator state depends on; restore refuses a different one."""
  data = {k: v for k, v in dataclasses.asdict(cfg.data).items()
          if k not in ("mixture", "eval_mixture")}  # The mixture read is given separately.
  return {
      "data": data, "mixture": mixture, "split": split,
      "family": cfg.model.family, "decoder_attention": cfg.model.decoder_attention,
      "continuous_positions": cfg.model.continuous_positions, "batch_size": batch_size,
      "shard_index": shard_index, "num_shards": num_shards, "shuffle": shuffle, "repeat": repeat,
  }


def make_dataset(cfg, *, split: str = "train", batch_size: int, shard_index: int = 0,
                 num_shards: int = 1, shuffle: bool = True, repeat: bool = True,
                 mixture: str | None = None, batched: bool = True):
  """The tf.data pipeline behind `make_iterator` (``batched=False``: one packed row each)."""
  import seqio  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  if not 0 <= shard_index < num_shards:
    raise ValueError(f"shard_index={shard_index} must be in [0, num_shards={num_shards})")
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  name = resolve_mixture(cfg, mixture)
  provider = seqio.get_mixture_or_task(name)
  lengths = task_feature_lengths(cfg, mixture)
  _check_vocab(cfg, provider)
  from t5like.data import caching  # pylint: disable=g-import-not-at-top
  use_cached = caching.use_cache(  # Extra eval sets are read on the fly.
      cfg.data, list(getattr(provider, "tasks", [provider])), tasks.spec_of_task,
      read_cache=not name.startswith(tasks.EXTRA_EVAL_PREFIX))
  common = dict(sequence_length=lengths, split=split, use_cached=use_cached, shuffle=shuffle,
                seed=cfg.data.seed, trim_output_features=True, try_in_mem_cache=False,
                shard_info=seqio.ShardInfo(shard_index, num_shards) if num_shards > 1 else None)
  if isinstance(provider, seqio.Mixture) and not repeat:
    keys = set(provider.output_features)
    parts = [t.get_dataset(num_epochs=1, **common).map(
        functools.partial(lambda ks, ex: {k: ex[k] for k in ks}, keys))
             for t in provider.tasks if split in t.splits]
    if not parts:
      raise ValueError(f"no task of {name} has a {split!r} split")
    ds = functools.reduce(lambda a, b: a.concatenate(b), parts)
  else:
    if split not in provider.splits:
      raise ValueError(f"{name} has no {split!r} split (splits: {sorted(provider.splits)})")
    ds = provider.get_dataset(num_epochs=None if repeat else 1, **common)
  ds = features.convert(ds, family=cfg.model.family, task_lengths=lengths, pack=cfg.data.pack,
                        continuous_positions=cfg.model.continuous_positions,
                        loss_on_inputs=cfg.data.loss_on_inputs)
  if batched:
    ds = ds.batch(batch_size, drop_remainder=repeat)
    if not repeat:
      ds = ds.map(functools.partial(_pad_rows, batch_size))
  options = tf.data.Options()
  options.deterministic = True
  # The jsonl reader's py_function is a pure function of (file, chunk index): nothing outside the
  # iterator state is needed to resume, so its "external state" can be ignored when saving.
  options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
  return ds.prefetch(2).with_options(options)


def _pad_rows(batch_size: int, batch):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def pad(x):
    return tf.pad(x, [[0, batch_size - tf.shape(x)[0]], [0, 0]])
  return {k: tf.ensure_shape(pad(v), [batch_size, v.shape[1]]) for k, v in batch.items()}


def _check_vocab(cfg, provider) -> None:
  vocab = next(iter(provider.output_features.values())).vocabulary
  if vocab.vocab_size != cfg.model.vocab_size:
    raise ValueError(vocab_mismatch_message(vocab.vocab_size, cfg))


def vocab_mismatch_message(size: int, cfg) -> str:
  where = cfg.data.vocab_path or "the embedded vocabulary (data.vocab_path='')"
  extra = cfg.data.extra_ids
  if extra:
    where += f" + data.extra_ids={extra} sentinels"
  unit = "ids" if extra else "pieces"
  return (f"the data vocabulary {where} has {size} {unit} but model.vocab_size="
          f"{cfg.model.vocab_size}: the two must be equal. Point data.vocab_path at a model of "
          f"{cfg.model.vocab_size - extra} pieces (python -m t5like.tools.build_vocab "
          f"--vocab_size {cfg.model.vocab_size}{f' --extra_ids {extra}' if extra else ''} ...) "
          f"or set model.vocab_size={size}")


_LIVE: "weakref.WeakSet[DataIterator]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
  """Drops live tf.data iterators before interpreter teardown (py_function readers can hang)."""
  for it in list(_LIVE):
    it.close()


class DataLayoutChanged(FileNotFoundError):
  """The saved data state is for another number of shards: not damage, a restart of the
  stream (the trainer then restarts every host's stream alike)."""


class DataIterator(Iterator[dict[str, np.ndarray]]):
  """Iterator of numpy batches with exact save/restore of its position and record statistics."""

  def __init__(self, dataset, *, fingerprint: Mapping[str, Any], task_names: list[str],
               split: str, shard_index: int = 0, num_shards: int = 1) -> None:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    self._dataset = dataset
    self._iterator = iter(dataset)
    self._checkpoint = tf.train.Checkpoint(iterator=self._iterator)
    self._fingerprint = json.loads(json.dumps(dict(fingerprint)))
    self._task_names = list(task_names)
    self._split = split
    self._shard_index, self._num_shards = shard_index, num_shards
    self.batches_read = 0
    _LIVE.add(self)

  @property
  def element_spec(self) -> dict[str, Any]:
    return self._dataset.element_spec

  def __iter__(self) -> "DataIterator":
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    if self._iterator is None:
      raise StopIteration
    batch = next(self._iterator)
    self.batches_read += 1
    return {k: v.numpy() for k, v in batch.items()}

  def _name(self) -> str:
    return f"data_iterator-{self._shard_index:05d}-of-{self._num_shards:05d}"

  def save(self, directory: str) -> str:
    """Writes this host's iterator state under ``directory``; returns the checkpoint prefix.

    ``tf.train.Checkpoint`` writes a local staging copy that is then copied through epath, so
    the state reaches a URI by the same file layer as the rest of the checkpoint.
    """
    target = epath.Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="t5like_data_state_") as tmp:
      self._checkpoint.write(os.path.join(tmp, self._name()))
      for f in sorted(os.listdir(tmp)):
        (target / f).write_bytes(pathlib.Path(tmp, f).read_bytes())
    (target / f"{self._name()}.json").write_text(json.dumps(
        {"fingerprint": self._fingerprint, "batches_read": self.batches_read}, sort_keys=True))
    return os.fspath(target / self._name())

  def restore(self, directory: str) -> None:
    """Restores the state written by `save` for the same config, split and shard."""
    source, name = epath.Path(directory), self._name()
    if not (source / f"{name}.json").exists():
      others = sorted(p.name for p in source.glob("data_iterator-*.json"))
      if others:
        raise DataLayoutChanged(
            f"{source} holds data iterator states {others}, not {name}.json: the checkpoint "
            f"was written with another number of data shards (hosts)")
      raise FileNotFoundError(f"no data iterator state {source / name}.json (saved by "
                              f"DataIterator.save for shard {self._shard_index} of "
                              f"{self._num_shards})")
    meta = json.loads((source / f"{name}.json").read_text())
    diff = _diff(meta["fingerprint"], self._fingerprint)
    if diff:
      raise ValueError(f"data iterator state in {directory} was saved with other data settings; "
                       f"differences (saved -> now): {'; '.join(diff)}")
    with tempfile.TemporaryDirectory(prefix="t5like_data_state_") as tmp:
      for f in source.glob(f"{name}.*"):
        if f.name != f"{name}.json":
          pathlib.Path(tmp, f.name).write_bytes(f.read_bytes())
      self._checkpoint.read(os.path.join(tmp, name)).assert_consumed()
    self.batches_read = int(meta["batches_read"])

  def stats(self) -> dict[str, Any]:
    """Batches read and record counts per task (good and bad, by kind) plus totals."""
    per_task = {t: tasks.task_stats(t, self._split) for t in self._task_names}
    totals: dict[str, int] = {}
    for counts in per_task.values():
      for k, v in counts.items():
        if isinstance(v, int):
          totals[k] = totals.get(k, 0) + v
    bad = sum(v for k, v in totals.items() if k != "ok")
    return {"batches": self.batches_read, "bad_records": bad, "totals": totals,
            "tasks": per_task}

  def close(self) -> None:
    """Releases the tf.data iterator (call before exiting; also done at interpreter exit)."""
    self._iterator = None
    self._checkpoint = None
    _LIVE.discard(self)


def _diff(saved: Any, now: Any, path: str = "") -> list[str]:
  if isinstance(saved, dict) and isinstance(now, dict):
    out = []
    for k in sorted(set(saved) | set(now)):
      out += _diff(saved.get(k), now.get(k), f"{path}.{k}" if path else k)
    return out
  return [] if saved == now else [f"{path}: {saved!r} -> {now!r}"]


def make_iterator(cfg, *, split: str = "train", batch_size: int, shard_index: int = 0,
                  num_shards: int = 1, shuffle: bool = True, repeat: bool = True,
                  mixture: str | None = None) -> DataIterator:
  """Batches of ``cfg``'s data for this host (see module docstring).

  Args:
    cfg: a validated ``t5like.config.Config`` (reads ``cfg.data`` and ``cfg.model``).
    split: "train" or "validation".
    batch_size: rows per batch on this host.
    shard_index: this host's index (``jax.process_index()``).
    num_shards: number of hosts (``jax.process_count()``).
    shuffle: shuffle files and examples (with ``cfg.data.seed``).
    repeat: repeat forever (training); False reads each task once and pads the last batch.
    mixture: task/mixture name; default ``cfg.data.mixture`` for "train" and
      ``cfg.data.eval_mixture or cfg.data.mixture`` otherwise.
  """
  return Iterators(cfg, split=split, batch_size=batch_size, shard_index=shard_index,
                   num_shards=num_shards, shuffle=shuffle, repeat=repeat, mixture=mixture)()


class Iterators:
  """Fresh `DataIterator`s over one pipeline built once (arguments as `make_iterator`).

  Building a pipeline sets up every seqio task and traces every map (seconds per task on a paper
  mixture); a held-out split is read again at every eval, so the trainer builds it once and
  starts a new iterator each time: same batches, from the first one.
  """

  def __init__(self, cfg, *, split: str = "train", batch_size: int, shard_index: int = 0,
               num_shards: int = 1, shuffle: bool = True, repeat: bool = True,
               mixture: str | None = None) -> None:
    import seqio  # pylint: disable=g-import-not-at-top

    from t5like import runtime
    runtime.init_tensorflow()  # Before tf.data builds anything: TF stays on the CPU.
    if mixture is None:
      mixture = (cfg.data.mixture if split == "train"
                 else (cfg.data.eval_mixture or cfg.data.mixture))
    self.dataset = make_dataset(cfg, split=split, batch_size=batch_size,
                                shard_index=shard_index, num_shards=num_shards, shuffle=shuffle,
                                repeat=repeat, mixture=mixture)
    provider = seqio.get_mixture_or_task(resolve_mixture(cfg, mixture))
    self._kwargs = dict(
        fingerprint=_fingerprint(cfg, split=split, batch_size=batch_size,
                                 shard_index=shard_index, num_shards=num_shards,
                                 shuffle=shuffle, repeat=repeat, mixture=mixture),
        task_names=[t.name for t in getattr(provider, "tasks", [provider])], split=split,
        shard_index=shard_index, num_shards=num_shards)

  def __call__(self) -> DataIterator:
    return DataIterator(self.dataset, **self._kwargs)
