"""How the trainer gets batches: per-host iterators over the data pipeline, assembled into
global arrays sharded over the mesh.

Each process reads its own shard (``shard_index = jax.process_index()``) with
``global_batch / process_count`` rows; ``global_batch`` turns the per-host numpy batches into
one global ``jax.Array`` per feature with ``jax.make_array_from_process_local_data``.

The iterator protocol the loop needs: ``next(it) -> dict[str, np.ndarray]`` ([rows, length]
int32), ``it.save(directory)`` / ``it.restore(directory)`` (saved with every checkpoint), and
optionally ``it.close()``. ``SyntheticData`` provides such iterators without any corpus (tests,
benchmarks); ``PipelineData`` wraps ``t5like.data.pipeline.make_iterator``.
"""
from __future__ import annotations

import json
import logging
from typing import Any, Iterator, Mapping, Protocol

import jax
import numpy as np
from etils import epath
from jax.sharding import NamedSharding

from t5like.config import Config, ConfigError


class DataIterator(Protocol):
  def __next__(self) -> dict[str, np.ndarray]: ...
  def save(self, directory: str) -> None: ...
  def restore(self, directory: str) -> None: ...


class DataSource(Protocol):
  """Makes the per-host iterators of one run."""

  def train(self, batch_size: int, shard_index: int, num_shards: int) -> DataIterator: ...

  def eval(self, batch_size: int, shard_index: int, num_shards: int) -> DataIterator | None:
    """A fresh, finite, unshuffled held-out iterator (same batches every call), or None.

    A source may also offer ``eval_parts(batch_size, shard_index, num_shards, max_batches)``
    -> ``[(part, rate, open_iterator, batches)]`` (a mixture's parts, see ``PipelineData``);
    the trainer then scores each part and reports their rate-weighted average."""


class PipelineData:
  """The seqio pipeline of ``t5like.data`` (training mixture; held-out eval split).

  Construction runs the data start-up checks (`t5like.data.checks.check_data`: corpus layout,
  vocabulary size, validation data): a misconfigured run fails here, before compilation.
  """

  def __init__(self, cfg: Config, *, check: bool = True):
    self.cfg = cfg
    self._eval_pipelines: dict[tuple, Any] = {}  # (rows, shard, shards, mixture) -> Iterators
    try:
      from t5like.data import checks, pipeline, shard_reader  # noqa: F401
    except ImportError as e:
      raise ConfigError(
          f"the data pipeline t5like.data.pipeline is not importable ({e}); it is needed to "
          f"train on data.mixture={cfg.data.mixture!r}") from e
    if check:
      checks.check_data(cfg)
    changed = shard_reader.raise_open_file_limit()  # Room for the reader's open shard streams.
    if changed:
      logging.getLogger("t5like.training").info(
          "raised this process's open-file limit from %d to %d: the data reader keeps up to "
          "$T5LIKE_OPEN_SHARDS=%d shard files open", *changed, shard_reader.open_shards_wanted())

  def train(self, batch_size, shard_index, num_shards):
    from t5like.data import pipeline
    return pipeline.make_iterator(self.cfg, split="train", batch_size=batch_size,
                                  shard_index=shard_index, num_shards=num_shards, shuffle=True,
                                  repeat=True)

  def eval(self, batch_size, shard_index, num_shards):
    """The validation split of ``data.eval_mixture`` (default: of ``data.mixture``)."""
    return self._held_out(batch_size, shard_index, num_shards, None)

  def eval_parts(self, batch_size, shard_index, num_shards, max_batches):
    """``(part, rate, open_iterator, batches)`` for each part of the held-out mixture: its fixed
    sample (`t5like.data.held_out`), the same rows at every eval and on any host count; the
    pipelines are built at the first eval and kept."""
    from t5like.data import held_out
    key = ("parts", batch_size, shard_index, num_shards, max_batches)
    if key not in self._eval_pipelines:
      parts = held_out.parts(self.cfg)
      self._eval_pipelines[key] = [
          (p.name, p.rate, held_out.sample_iterator_factory(
              self.cfg, p, batches=n, global_rows=batch_size * num_shards,
              batch_size=batch_size, shard_index=shard_index, num_shards=num_shards), n)
          for p, n in zip(parts, held_out.part_batches(parts, max_batches))]
    return self._eval_pipelines[key]

  def extra_evals(self, batch_size, shard_index, num_shards) -> dict[str, DataIterator]:
    """Fresh iterators over the ``data.extra_eval`` sets, by name (Paloma-style eval)."""
    from t5like.data import pipeline
    return {name: self._held_out(batch_size, shard_index, num_shards, task)
            for name, task in pipeline.extra_eval_mixtures(self.cfg).items()}

  def _held_out(self, batch_size, shard_index, num_shards, mixture):
    """A fresh iterator over a held-out pipeline built at the first eval and kept (`Iterators`)."""
    from t5like.data import pipeline
    key = (batch_size, shard_index, num_shards, mixture)
    if key not in self._eval_pipelines:
      self._eval_pipelines[key] = pipeline.Iterators(
          self.cfg, split="validation", batch_size=batch_size, shard_index=shard_index,
          num_shards=num_shards, shuffle=False, repeat=False, mixture=mixture)
    return self._eval_pipelines[key]()


def extra_eval_iterators(data: DataSource, batch_size: int, shard_index: int, num_shards: int
                         ) -> list[tuple[str, DataIterator]]:
  """``(name, iterator)`` of the source's extra held-out sets (``data.extra_eval``), if any."""
  make = getattr(data, "extra_evals", None)
  return sorted(make(batch_size, shard_index, num_shards).items()) if make else []


def global_batch(local: Mapping[str, np.ndarray], sharding: NamedSharding,
                 global_rows: int) -> dict[str, jax.Array]:
  """Per-host rows -> global arrays [global_rows, ...] sharded by ``sharding``."""
  out = {}
  for k, v in local.items():
    v = np.asarray(v)
    out[k] = jax.make_array_from_process_local_data(sharding, v, (global_rows,) + v.shape[1:])
  return out


# ----------------------------------------------------------------------------------------------
# Synthetic data: learnable token streams with the features of every objective, no corpus needed.


class SyntheticIterator:
  """Deterministic batches of a fixed random Markov chain (each token has ``branching`` likely
  successors), so a model can learn far below the unigram entropy. Batch ``i`` of shard ``s``
  depends only on (seed, s, i); the state saved with a checkpoint is ``i``."""

  def __init__(self, *, family: str, prefix: bool, vocab_size: int, batch_size: int,
               length: int, inputs_length: int, seed: int, shard_index: int,
               num_batches: int | None = None, branching: int = 4):
    self.family, self.prefix = family, prefix
    self.vocab, self.rows = vocab_size, batch_size
    self.length, self.inputs_length = length, inputs_length
    self.seed, self.shard, self.num_batches = seed, shard_index, num_batches
    table_rng = np.random.default_rng(seed)
    self.successors = table_rng.integers(3, vocab_size, size=(vocab_size, branching))
    self.index = 0

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    return self

  def _stream(self, rng: np.random.Generator, n: int) -> np.ndarray:
    out = np.empty((self.rows, n), np.int64)
    tok = rng.integers(3, self.vocab, size=self.rows)
    for t in range(n):
      out[:, t] = tok
      choice = rng.integers(0, self.successors.shape[1], size=self.rows)
      tok = self.successors[tok, choice]
    return out

  def __next__(self) -> dict[str, np.ndarray]:
    if self.num_batches is not None and self.index >= self.num_batches:
      raise StopIteration
    rng = np.random.default_rng([self.seed, self.shard, self.index, 7])
    self.index += 1
    i32 = lambda x: np.asarray(x, np.int32)  # noqa: E731
    ones = lambda n: np.ones((self.rows, n), np.int32)  # noqa: E731
    pos = lambda n, start=0: np.broadcast_to(np.arange(start, start + n), (self.rows, n))  # noqa
    if self.family == "redllm":
      k, m = self.inputs_length, self.length
      seq = self._stream(rng, k + m)
      inputs, targets = seq[:, :k], seq[:, k:]
      dec_in = np.concatenate([np.zeros((self.rows, 1), np.int64), targets[:, :-1]], axis=1)
      return {
          "encoder_input_tokens": i32(inputs), "encoder_segment_ids": ones(k),
          "encoder_positions": i32(pos(k)), "decoder_input_tokens": i32(dec_in),
          "decoder_target_tokens": i32(targets), "decoder_loss_weights": ones(m),
          "decoder_segment_ids": ones(m), "decoder_positions": i32(pos(m, k))}
    n = self.length
    targets = self._stream(rng, n)
    dec_in = np.concatenate([np.zeros((self.rows, 1), np.int64), targets[:, :-1]], axis=1)
    batch = {
        "decoder_input_tokens": i32(dec_in), "decoder_target_tokens": i32(targets),
        "decoder_loss_weights": ones(n), "decoder_segment_ids": ones(n),
        "decoder_positions": i32(pos(n))}
    if self.prefix:
      k = min(self.inputs_length, n - 1)
      batch["decoder_causal_attention"] = i32(pos(n) < k)
      batch["decoder_loss_weights"] = i32(pos(n) >= k)
    return batch

  def save(self, directory: str) -> None:
    path = epath.Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / "synthetic_iterator.json").write_text(
        json.dumps({"index": self.index, "shard": self.shard, "seed": self.seed}))

  def restore(self, directory: str) -> None:
    saved = json.loads((epath.Path(directory) / "synthetic_iterator.json").read_text())
    if (saved["seed"], saved["shard"]) != (self.seed, self.shard):
      raise ValueError(f"synthetic iterator state saved with seed/shard "
                       f"{saved['seed']}/{saved['shard']}, now {self.seed}/{self.shard}")
    self.index = int(saved["index"])


class SyntheticData:
  """A ``DataSource`` of ``SyntheticIterator``s shaped by ``cfg`` (model family, lengths)."""

  def __init__(self, cfg: Config, *, eval_batches: int = 4):
    self.cfg = cfg
    self.eval_batches = eval_batches

  def _make(self, batch_size: int, shard_index: int, seed: int, num_batches: int | None):
    m, d = self.cfg.model, self.cfg.data
    red = m.family == "redllm"
    return SyntheticIterator(
        family=m.family, prefix=m.decoder_attention == "prefix", vocab_size=m.vocab_size,
        batch_size=batch_size, length=d.targets_length if red else d.sequence_length,
        inputs_length=d.inputs_length, seed=seed, shard_index=shard_index,
        num_batches=num_batches)

  def train(self, batch_size, shard_index, num_shards):
    return self._make(batch_size, shard_index, self.cfg.data.seed, None)

  def eval(self, batch_size, shard_index, num_shards):
    it = self._make(batch_size, shard_index, self.cfg.data.seed, self.eval_batches)
    it.index = 10**6  # Held-out: batches the training stream does not reach in tests.
    it.num_batches = it.index + self.eval_batches
    return it


def unigram_entropy(batches: Any) -> float:
  """Entropy (nats) of the target-token unigram distribution of ``batches`` (loss-weighted)."""
  counts: dict[int, float] = {}
  for b in batches:
    t = np.asarray(b["decoder_target_tokens"]).ravel()
    w = np.asarray(b.get("decoder_loss_weights", t > 0)).ravel().astype(np.float64)
    ids, inv = np.unique(t, return_inverse=True)
    sums = np.bincount(inv, weights=w)
    for i, s in zip(ids.tolist(), sums.tolist()):
      counts[i] = counts.get(i, 0.0) + s
  p = np.array([c for c in counts.values() if c > 0])
  p = p / p.sum()
  return float(-(p * np.log(p)).sum())
