"""Hosts share a part's files by one rule on the fly and from a cache (`host_shards`): whole
files when there are enough, else every n-th record of each file; a cache of ``min_shards``
shards per file lets each host read only the shards holding its records."""
import json
import os
import shutil

import pytest
import seqio

from cache_checks import (assert_cached_equals_on_the_fly, redpajama_config, same, take,
                          with_cache)
from t5like.data import caching, pipeline, tasks

ONLY_ARXIV = '{"book": 0, "c4": 0, "common_crawl": 0, "github": 0, "stackexchange": 0, ' \
             '"wikipedia": 0}'


def _cfg(make_cfg, redpajama_root):
  return make_cfg(**{"data.mixture": "redpajama_v1", "data.data_dir": redpajama_root[0],
                     "data.validation_dir": redpajama_root[1], "data.mixture_rates": ONLY_ARXIV})


def _texts(ds):
  return [ex["text"] for ex in ds.as_numpy_iterator()]


def test_fewer_files_than_hosts_every_host_keeps_every_nth_record_of_each_file(
    make_cfg, redpajama_root):
  cfg = _cfg(make_cfg, redpajama_root)
  tasks.register(tasks.spec_from_config(cfg, "redpajama_v1", "lm"))
  source = seqio.get_mixture_or_task("redpajama_v1.arxiv:lm").source
  files = source.list_shards("train")
  assert len(files) == 2
  whole = [_texts(source.get_dataset("train", shuffle=False, shard_info=seqio.ShardInfo(f, 2)))
           for f in range(2)]  # As many hosts as files: one whole file each.
  assert all(whole) and not set(whole[0]) & set(whole[1])
  seen = []
  for host in range(4):
    got = _texts(source.get_dataset("train", shuffle=False, shard_info=seqio.ShardInfo(host, 4)))
    assert sorted(got) == sorted(whole[0][host::4] + whole[1][host::4]), host
    for w in whole:  # Each file's records in their file order.
      assert [t for t in got if t in set(w)] == w[host::4]
    seen += got
  assert sorted(seen) == sorted(whole[0] + whole[1])  # Every record once, on one host.


@pytest.fixture(scope="module")
def split_cache(tmp_path_factory, redpajama_root, spm_path):
  """The arxiv part (2 train files) cached with min_shards=4: 4 shards per file."""
  cfg = redpajama_config(redpajama_root, spm_path, ONLY_ARXIV)
  spec = tasks.spec_from_config(cfg, "redpajama_v1", "lm")
  tasks.register(spec)
  out = tmp_path_factory.mktemp("split_cache")
  caching.build(spec, ["redpajama_v1.arxiv:lm"], str(out), min_shards=4)
  return str(out)


def test_a_split_of_few_files_is_min_shards_per_file_and_a_host_reads_only_its_share(
    make_cfg, redpajama_root, split_cache, tmp_path):
  part = os.path.join(split_cache, "redpajama_v1.arxiv")
  manifest = json.load(open(os.path.join(part, caching.MANIFEST)))
  assert manifest["shards_per_file"]["train"] == 4
  assert json.load(open(os.path.join(part, "info.train.json")))["num_shards"] == 8
  train = sorted(f for f in os.listdir(part) if f.startswith("train.tfrecord-"))
  assert len(train) == 8 and train[-1].endswith("-00007-of-00008")
  cfg = _cfg(make_cfg, redpajama_root)
  # 4 hosts, 2 files: the per-file rule, read from the shards; exact, resumption included.
  assert_cached_equals_on_the_fly(cfg, split_cache, tmp_path / "h4", num_shards=4, batches=4)
  kw = dict(batch_size=3, shard_index=0, num_shards=4)
  want = take(pipeline.make_iterator(cfg, **kw), 4)
  share = tmp_path / "host0_only"  # Host 0 of 4 needs shards 0 and 4 of a file's 4: drop others.
  shutil.copytree(split_cache, share)
  for name in train:
    if int(name.split("-")[1]) % 4:
      os.remove(share / "redpajama_v1.arxiv" / name)
  got = take(pipeline.make_iterator(with_cache(cfg, str(share)), **kw), 4)
  assert same(got, want)


@pytest.mark.slow  # make test's budget (docs/tests.md)
def test_split_cache_is_exact_for_any_host_count(make_cfg, redpajama_root, split_cache,
                                                 tmp_path):
  cfg = _cfg(make_cfg, redpajama_root)
  for hosts in (1, 2, 3):  # Whole (virtual) files; 3 hosts: 4 shards per file read whole.
    assert_cached_equals_on_the_fly(cfg, split_cache, tmp_path / str(hosts), num_shards=hosts)
