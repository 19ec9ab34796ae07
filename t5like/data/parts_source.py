"""A seqio source that samples several sources (the conversion parts of one FLAN sub-mixture).

Written by hand because a `seqio.TfdsDataSource` reads one TFDS dataset and each FLAN conversion
part (`tfds_builder`) is its own dataset.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

import seqio
import tensorflow as tf


class PartsSource(seqio.DataSource):
  """Samples the examples of ``parts`` in proportion to ``weights[split]`` (one weight per part
  that has the split, in order) until every part is exhausted: one epoch of each.

  Sharding across hosts is done per part with seqio's own rule: whole files when a part has at
  least as many as there are shards, else every n-th example.
  """

  def __init__(self, parts: Sequence[seqio.DataSource],
               weights: Mapping[str, Sequence[float]]) -> None:
    self._parts, self._weights = list(parts), {s: list(w) for s, w in weights.items()}
    super().__init__(splits=tuple(weights), caching_permitted=False)

  @property
  def supports_arbitrary_sharding(self) -> bool:
    return True  # Each part is sharded in `get_dataset`.

  def _having(self, split: str) -> list[seqio.DataSource]:
    return [p for p in self._parts if split in p.splits]

  def list_shards(self, split: str) -> Sequence[str]:
    return [s for p in self._having(split) for s in p.list_shards(split)]

  def get_dataset(self, split: str = "train", shuffle: bool = True, seed: Optional[int] = None,
                  shard_info: Optional[seqio.ShardInfo] = None, **unused) -> tf.data.Dataset:
    dss = []
    for part in self._having(split):
      whole = not shard_info or len(part.list_shards(split)) >= shard_info.num_shards
      ds = part.get_dataset(split, shuffle=shuffle, seed=seed,
                            shard_info=shard_info if whole else None)
      dss.append(ds if whole else ds.shard(shard_info.num_shards, shard_info.index))
    if len(dss) == 1:
      return dss[0]
    return tf.data.Dataset.sample_from_datasets(
        dss, weights=self._weights[split], seed=0 if seed is None else seed,
        stop_on_empty_dataset=False)
