"""Checks shared by the cache tests (`test_caching.py` here, `test_cache_beam.py` on Beam): the
cached pipeline against the on-the-fly one, batch for batch."""
from __future__ import annotations

import copy

import numpy as np

from t5like.data import pipeline


def take(it, n):
  return [next(it) for _ in range(n)]


def same(a, b) -> bool:
  return len(a) == len(b) and all(
      x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x) for x, y in zip(a, b))


def with_cache(cfg, cache_dir: str):
  out = copy.deepcopy(cfg)
  out.data.cache_dir = cache_dir
  return out


def redpajama_config(redpajama_root, spm_path: str, mixture_rates: str):
  """A validated Config reading the RedPajama fixture corpus (for module-scoped fixtures, where
  the function-scoped ``make_cfg`` is not available)."""
  from t5like.config import Config, apply_overrides
  from t5like.data import vocab
  cfg = Config()
  apply_overrides(cfg, [f"data.vocab_path={spm_path}", "data.mixture=redpajama_v1",
                        f"data.data_dir={redpajama_root[0]}", f"data.mixture_rates={mixture_rates}",
                        f"data.validation_dir={redpajama_root[1]}",
                        f"model.vocab_size={vocab.vocab_size(spm_path)}"])
  return cfg.validate()


def assert_cached_equals_on_the_fly(cfg, cache_dir: str, tmp_path, *, num_shards: int = 1,
                                    batches: int = 6, batch_size: int = 3) -> None:
  """Every host's batches from the cache == on the fly, and a cached iterator saved after
  ``batches // 2`` and restored continues with the on-the-fly batches."""
  cached_cfg = with_cache(cfg, cache_dir)
  for shard in range(num_shards):
    kw = dict(batch_size=batch_size, shard_index=shard, num_shards=num_shards)
    fly = take(pipeline.make_iterator(cfg, **kw), batches)
    it = pipeline.make_iterator(cached_cfg, **kw)
    half = batches // 2
    got = take(it, half)
    it.save(str(tmp_path / f"state{shard}"))
    assert same(got, fly[:half]), f"host {shard} of {num_shards}: cached != on the fly"
    fresh = pipeline.make_iterator(cached_cfg, **kw)
    first = take(fresh, 1)
    fresh.restore(str(tmp_path / f"state{shard}"))
    rest = take(fresh, batches - half)
    assert same(rest, fly[half:]), f"host {shard} of {num_shards}: resumed cache != on the fly"
    assert same(first, fly[:1])
  if num_shards > 1:  # The hosts read different data.
    a = take(pipeline.make_iterator(cached_cfg, batch_size=batch_size, shard_index=0,
                                    num_shards=num_shards), 1)
    b = take(pipeline.make_iterator(cached_cfg, batch_size=batch_size, shard_index=1,
                                    num_shards=num_shards), 1)
    assert not same(a, b)
