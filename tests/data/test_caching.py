"""Cacheable tasks and training from a cache (`t5like.data.caching`), without Beam: the cache is
built here file by file (`caching.build`, what each Beam worker runs; `test_cache_beam.py` builds
it on Beam)."""
import dataclasses
import json
import os

import pytest
import seqio

from cache_checks import assert_cached_equals_on_the_fly, redpajama_config, take, with_cache
from t5like.data import caching, counts, pipeline, tasks

ONLY_3 = '{"c4": 0, "common_crawl": 0, "github": 0, "stackexchange": 0}'


def _rp(make_cfg, root, **kw):
  return make_cfg(**{"data.mixture": "redpajama_v1", "data.data_dir": root[0],
                     "data.validation_dir": root[1], "data.mixture_rates": ONLY_3, **kw})


def _flan(make_cfg, root, **kw):
  return make_cfg(**{"data.mixture": "flan", "data.data_dir": root, "data.inputs_length": 64,
                     **kw})


def _leaves(cfg):
  provider = seqio.get_mixture_or_task(pipeline.resolve_mixture(cfg))
  return list(getattr(provider, "tasks", [provider]))


def _build(cfg, out) -> list[str]:
  """Caches every part of cfg's corpus as cache_data does (lm / it variant)."""
  spec = tasks.spec_from_config(cfg, cfg.data.mixture.split(".")[0],
                                "it" if "flan" in cfg.data.mixture else "lm")
  tasks.register(spec)
  names = [n for n in seqio.TaskRegistry.names() if tasks.spec_of_task(n) == spec]
  return caching.build(spec, names, str(out))


def _name(step) -> str:
  return getattr(getattr(step, "func", step), "__name__", type(step).__name__)


SPAN = {"data.objective": "span_corruption", "data.extra_ids": 100}


@pytest.mark.parametrize("corpus, overrides, after", [
    ("rp", {}, ["causal_lm"]),
    ("rp", {"model.family": "redllm"}, ["prefix_lm_middle"]),
    ("rp", {"model.family": "redllm", "data.prefix_split": "random"},
     ["prefix_lm_random"]),
    ("rp", {"model.family": "redllm", **SPAN}, ["span_corruption"]),
    ("rp", {"model.family": "redllm", "data.objective": "ul2", "data.extra_ids": 100},
     ["span_corruption", "prefix_lm_denoiser"]),
    ("flan", {}, ["append_eos_after_trim"]),
    ("flan", {"data.flan_grouping": "submixture"}, ["append_eos_after_trim"]),
])
def test_placeholder_sits_after_tokenize_and_before_every_length_or_seed_step(
    make_cfg, redpajama_root, flan_root, spm_path, corpus, overrides, after):
  from t5like.data import vocab
  if "data.extra_ids" in overrides:
    overrides = {**overrides, "model.vocab_size": vocab.vocab_size(spm_path) + 100}
  cfg = (_rp(make_cfg, redpajama_root, **overrides) if corpus == "rp"
         else _flan(make_cfg, flan_root, **overrides))
  seen_after = set()
  for task in _leaves(cfg):
    assert task.supports_caching and task.source.caching_permitted, task.name
    steps = task.preprocessors
    i = next(k for k, p in enumerate(steps) if isinstance(p, seqio.CacheDatasetPlaceholder))
    assert _name(steps[i - 1]) == "tokenize"
    assert [_name(p) for p in steps[:i]] == (["rekey", "tokenize"] if corpus == "rp"
                                             else ["tokenize"])
    seen_after.update(_name(p) for p in steps[i + 1:])
  assert set(after) <= seen_after


def test_missing_or_incomplete_cache_is_one_error_naming_the_build_command(
    make_cfg, redpajama_root, tmp_path):
  cfg = with_cache(_rp(make_cfg, redpajama_root), str(tmp_path / "cache"))
  with pytest.raises(caching.CacheError, match=(
      r"no complete cache of redpajama_v1\.\w+ .*COMPLETED does not exist.*python -m "
      r"t5like\.tools\.cache_data --corpus redpajama --data_dir " + redpajama_root[0])):
    pipeline.make_iterator(cfg, batch_size=2)
  cfg.data.source = "tfds"
  with pytest.raises(caching.CacheError, match="set data.source=jsonl"):
    pipeline.make_iterator(cfg, batch_size=2)


@pytest.fixture(scope="module")
def rp_cache(tmp_path_factory, redpajama_root, spm_path):
  out = tmp_path_factory.mktemp("rp_cache")
  dirs = _build(redpajama_config(redpajama_root, spm_path, ONLY_3), out)
  assert sorted(os.path.basename(d) for d in dirs) == [
      "redpajama_v1.arxiv", "redpajama_v1.book", "redpajama_v1.wikipedia"]
  return str(out)


@pytest.mark.parametrize("overrides", [
    {},  # DecLLM causal.
    pytest.param({"model.family": "redllm", "data.prefix_split": "random",
                  "data.pretrain_chunking": "stream"}, marks=pytest.mark.slow),
])
@pytest.mark.slow  # make test's 15-minute budget on 2 cores (docs/tests.md)
def test_cached_batches_are_the_on_the_fly_batches_on_two_hosts_and_after_a_resume(
    make_cfg, redpajama_root, rp_cache, tmp_path, overrides):
  cfg = _rp(make_cfg, redpajama_root, **overrides)
  assert_cached_equals_on_the_fly(cfg, rp_cache, tmp_path, num_shards=2)


def test_cache_of_other_data_is_refused(make_cfg, redpajama_root, rp_cache, tmp_path):
  import shutil
  cache = tmp_path / "copy"
  shutil.copytree(rp_cache, cache)
  manifest_path = cache / "redpajama_v1.book" / caching.MANIFEST
  manifest = json.loads(manifest_path.read_text())
  cfg = with_cache(_rp(make_cfg, redpajama_root), str(cache))
  for key, value, message in [("vocabulary_sha256", "0" * 64, "another vocabulary"),
                              ("seqio_version", "0.0.1", "another seqio version"),
                              ("files", {"train": ["x.jsonl"]}, "other source files")]:
    bad = json.loads(json.dumps(manifest))
    bad["identity"][key] = value
    manifest_path.write_text(json.dumps(bad))
    with pytest.raises(caching.CacheError, match=f"redpajama_v1.book was built from {message}"):
      pipeline.make_iterator(cfg, batch_size=2)
  manifest_path.write_text(json.dumps(manifest))
  take(pipeline.make_iterator(cfg, batch_size=2), 1)
  (cache / "redpajama_v1.book" / caching.COMPLETED).unlink()
  with pytest.raises(caching.CacheError, match="no complete cache of redpajama_v1.book"):
    pipeline.make_iterator(cfg, batch_size=2)


@pytest.mark.parametrize("grouping", ["task", pytest.param("submixture", marks=pytest.mark.slow)])
def test_flan_from_cache_needs_no_count_of_any_file(make_cfg, flan_root, tmp_path, monkeypatch,
                                                    grouping):
  cfg = _flan(make_cfg, flan_root, **{"data.flan_grouping": grouping,
                                      "data.flan_example_cap": 20})
  _build(cfg, tmp_path / "cache")
  cached = with_cache(cfg, str(tmp_path / "cache"))
  spec = tasks.spec_from_config(cfg, "flan", "it")  # Registered anew below: fresh rates.
  tasks.register(dataclasses.replace(spec, shuffle_buffer_size=spec.shuffle_buffer_size + 1))
  monkeypatch.setattr(counts.CorpusCounts, "count", lambda *a: pytest.fail("counted files"))
  it = pipeline.make_iterator(cached, batch_size=3)
  got = take(it, 4)
  stats = it.stats()
  # Good records read when caching (the capped reader reads whole first chunks of 256 lines).
  assert stats["totals"]["ok"] == 100
  assert stats["tasks"] and all(s["where"] == "cache" for s in stats["tasks"].values())
  monkeypatch.undo()
  from cache_checks import same
  assert same(got, take(pipeline.make_iterator(cfg, batch_size=3), 4))


def test_module_import_registers_the_cacheable_tasks(monkeypatch, redpajama_root, spm_path):
  import importlib
  import sys
  monkeypatch.setenv("T5LIKE_SEQIO_CORPORA", json.dumps([{
      "corpus": "redpajama", "data_dir": redpajama_root[0],
      "config": [f"data.vocab_path={spm_path}", f"data.mixture_rates={ONLY_3}"]}]))
  sys.modules.pop("t5like.data.seqio_tasks", None)
  module = importlib.import_module("t5like.data.seqio_tasks")
  assert module.MIXTURES == ["embedded_redpajama:lm", "embedded_flan", "redpajama_v1:lm"]
  for name in ("embedded_redpajama.c4:lm", "redpajama_v1.book:lm"):
    assert seqio.get_mixture_or_task(name).supports_caching
