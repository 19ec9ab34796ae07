"""Validation hold-out by document hash, for corpora (or FLAN tasks) without validation files.

With ``data.validation_holdout = f > 0``, every part of a corpus that has no validation files
(RedPajama without ``data.validation_dir``; a FLAN task with only ``train.jsonl``) gets a
``validation`` split made of the documents whose hash falls below ``f``, and its ``train`` split
drops exactly those documents. The hash is TensorFlow's FarmHash fingerprint
(``tf.strings.to_hash_bucket_fast``) of the document's ``text`` (FLAN: its ``inputs``), so:

* the split depends only on the document, not on file names, sharding, hosts or the seed;
* identical documents (duplicates across shards) all land on the same side;
* jsonl and TFDS sources hold out the same documents.

Cost: training filters each record once (C++ hash of raw text, before tokenisation); an eval reads
about ``1/f`` documents per held-out document it scores (f = 0.01: 100x; prefer a real
``data.validation_dir`` when one exists).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import seqio
import tensorflow as tf

HASH_BUCKETS = 1 << 40


def holdout_threshold(fraction: float) -> int:
  return int(round(fraction * HASH_BUCKETS))


def is_held_out(text: tf.Tensor, fraction: float) -> tf.Tensor:
  """True for the documents (scalar string ``text``) in the held-out slice of size ``fraction``."""
  bucket = tf.strings.to_hash_bucket_fast(text, HASH_BUCKETS)
  return bucket < holdout_threshold(fraction)


class HoldoutSource(seqio.DataSource):
  """Wraps a source without a ``validation`` split: ``validation`` = held-out documents of its
  ``train`` split, ``train`` = the others (see the module docstring)."""

  def __init__(self, base: seqio.DataSource, fraction: float, field: str) -> None:
    if "validation" in base.splits:
      raise ValueError("HoldoutSource wraps sources without a validation split")
    if not 0 < fraction < 1:
      raise ValueError(f"hold-out fraction must be in (0, 1), got {fraction}")
    self._base, self._fraction, self._field = base, fraction, field
    super().__init__(splits=tuple(base.splits) + ("validation",),
                     caching_permitted=base.caching_permitted)

  @property
  def supports_arbitrary_sharding(self) -> bool:
    return self._base.supports_arbitrary_sharding

  def list_shards(self, split: str) -> Sequence[str]:
    return self._base.list_shards("train" if split == "validation" else split)

  def get_dataset(self, split: str = "train", shuffle: bool = True, seed: Optional[int] = None,
                  shard_info: Optional[seqio.ShardInfo] = None, *,
                  sequence_length: Optional[Mapping[str, int]] = None, use_cached: bool = False,
                  num_epochs: Optional[int] = 1) -> tf.data.Dataset:
    held = split == "validation"
    ds = self._base.get_dataset(
        split="train" if held else split, shuffle=shuffle, seed=seed, shard_info=shard_info,
        sequence_length=sequence_length, use_cached=use_cached, num_epochs=num_epochs)
    field, fraction = self._field, self._fraction

    def keep(ex: Mapping[str, Any]) -> tf.Tensor:
      out = is_held_out(ex[field], fraction)
      return out if held else tf.logical_not(out)
    return ds.filter(keep)


def with_holdout(source: seqio.DataSource, fraction: float, field: str) -> seqio.DataSource:
  """``source`` itself if it has validation data or ``fraction`` is 0, else a `HoldoutSource`."""
  if fraction <= 0 or "validation" in source.splits:
    return source
  return HoldoutSource(source, fraction, field)
