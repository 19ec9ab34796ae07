"""How the hosts of a run share a corpus part's files, on the fly and from its cache.

Rule (both paths, so a cached run yields exactly the on-the-fly batches):

- at least as many files as hosts: each host reads whole files, seqio's own rule (file list
  sharded, then shuffled with the data seed, then interleaved);
- fewer files than hosts: every host reads every file and keeps every ``num_hosts``-th record
  **of each file** (``shard`` before the interleave). seqio would interleave first and keep every
  n-th example of the mixed stream; sharding each file instead is what lets a cache read less.

A cache (`caching`) writes a split with fewer files than ``--min_shards`` as ``min_shards``
shards per file, record ``k`` of a file in its shard ``k mod min_shards``: when the host count
divides ``min_shards``, a host reads only the shards holding its records (1/n of the bytes); else
it reads the whole file and keeps its records, as on the fly. Written by hand because seqio's
file sources know neither the per-file rule nor a file stored as several shards.
"""
from __future__ import annotations

import json
import logging
from typing import Optional, Sequence

import numpy as np
import seqio
import tensorflow as tf

log = logging.getLogger(__name__)


def _file_order(num_files: int, shard_info: Optional[seqio.ShardInfo], shuffle: bool,
                seed: Optional[int]) -> tuple[tf.data.Dataset, bool]:
  """The file indices a host reads, in seqio's order; and whether it reads them whole."""
  order = tf.data.Dataset.from_tensor_slices(np.arange(num_files, dtype=np.int64))
  whole = not shard_info or num_files >= shard_info.num_shards
  if shard_info and whole:
    order = order.shard(shard_info.num_shards, shard_info.index)
  if shuffle:  # The permutation depends on the seed and the buffer only, as seqio's of names.
    order = order.shuffle(buffer_size=num_files, seed=seed)
  return order, whole


class JsonlSource(seqio.FileDataSource):
  """A seqio file source that shards files with fewer files than hosts per file (above)."""

  @property
  def supports_arbitrary_sharding(self) -> bool:
    return True  # Sharded here, by the rule above.

  def get_dataset(self, split: str = "train", shuffle: bool = True, seed: Optional[int] = None,
                  shard_info: Optional[seqio.ShardInfo] = None, **unused) -> tf.data.Dataset:
    files = self.list_shards(split)
    if not files or not shard_info or len(files) >= shard_info.num_shards:
      return super().get_dataset(split=split, shuffle=shuffle, seed=seed, shard_info=shard_info)
    order, _ = _file_order(len(files), shard_info, shuffle, seed)
    names = tf.constant(files)
    n, i = shard_info.num_shards, shard_info.index
    return order.interleave(lambda k: self._reader(tf.gather(names, k)).shard(n, i),
                            cycle_length=self._cycle_length, block_length=self._block_length,
                            num_parallel_calls=tf.data.AUTOTUNE)


def shards_per_file(num_files: int, min_shards: int) -> int:
  """How many cache shards each source file of a split with ``num_files`` files becomes."""
  return min_shards if 0 < num_files < min_shards else 1


class CachedSource(seqio.dataset_providers._CachedDataSource):  # pylint: disable=protected-access
  """seqio's reader of a cached split whose source files are ``per_file`` shards each
  (`shards_per_file`), read by the rule above with the interleave of the jsonl source."""

  def __init__(self, cache_dir: str, split: str, per_file: int, cycle_length: int,
               block_length: int) -> None:
    super().__init__(cache_dir=cache_dir, split=split, cycle_length=cycle_length,
                     block_length=block_length)
    with tf.io.gfile.GFile(seqio.utils.get_cached_info_path(cache_dir, split)) as f:
      total = json.load(f)["num_shards"]
    prefix = seqio.utils.get_cached_tfrecord_prefix(cache_dir, split)
    self._shards = {split: [f"{prefix}-{j:05d}-of-{total:05d}" for j in range(total)]}
    self._per_file = per_file

  @property
  def supports_arbitrary_sharding(self) -> bool:
    return True

  def list_shards(self, split: str) -> Sequence[str]:
    return self._shards[split]  # Named, not listed: a host opens only the shards it reads.

  def get_dataset(self, split: str = "train", shuffle: bool = True, seed: Optional[int] = None,
                  shard_info: Optional[seqio.ShardInfo] = None, **unused) -> tf.data.Dataset:
    shards, q = self.list_shards(split), self._per_file
    if not shards or len(shards) % q:
      raise ValueError(f"{self._split_to_filepattern[split]}: {len(shards)} cache shards, not "
                       f"{q} per source file (a cache written by another t5like?)")
    num_files = len(shards) // q
    order, whole = _file_order(num_files, shard_info, shuffle, seed)
    n, i = (shard_info.num_shards, shard_info.index) if shard_info else (1, 0)
    if whole or q % n == 0:  # Whole files, or exactly the shards that hold this host's records.
      picked, keep_every = list(range(q) if whole else range(i, q, n)), 1
    else:
      picked, keep_every = list(range(q)), n
      log.warning("%s: %d hosts read a cache of %d shards per file: every host reads whole "
                  "files; rebuild it with cache_data --min_shards a multiple of %d to read 1/%d "
                  "each", self._split_to_filepattern[split], n, q, n, n)
    table = tf.constant(np.array(shards).reshape(num_files, q)[:, picked])

    def one_file(k):  # Its records in file order: the picked shards taken in turn, one by one.
      ds = tf.data.Dataset.from_tensor_slices(table[k]).interleave(
          self._reader, cycle_length=len(picked), block_length=1)
      return ds.shard(keep_every, i) if keep_every > 1 else ds

    return order.interleave(one_file, cycle_length=self._cycle_length,
                            block_length=self._block_length, num_parallel_calls=tf.data.AUTOTUNE)
