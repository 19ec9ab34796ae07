"""Caches built on Beam (`python -m t5like.tools.cache_data`, the multi-process DirectRunner) on
the embedded corpora (1-2 files per split: 64 shards each, `--min_shards`' default): training from
them yields exactly the on-the-fly batches (1 and 2 hosts, a resume mid-epoch); a cache of
another vocabulary is refused. `make test-beam` (.venv-beam)."""
import json
import os

import pytest

from cache_checks import assert_cached_equals_on_the_fly
from t5like.config import Config, apply_overrides
from t5like.data import caching, pipeline

pytestmark = pytest.mark.beam

BEAM = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]


def _cfg(**overrides):
  cfg = Config()
  base = {"data.sequence_length": "64", "data.inputs_length": "32", "data.targets_length": "32",
          "data.shuffle_buffer_size": "64", "model.vocab_size": "8192"}
  base.update(overrides)
  apply_overrides(cfg, [f"{k}={v}" for k, v in base.items()])
  return cfg.validate()


def _cache(argv, capsys):
  from t5like.tools import cache_data
  summary = cache_data.main(argv + BEAM)
  capsys.readouterr()
  return summary


@pytest.fixture(scope="module")
def rp_cache(tmp_path_factory):
  from t5like.tools import cache_data
  out = str(tmp_path_factory.mktemp("rp_cache"))
  summary = cache_data.main(["--corpus", "embedded_redpajama", "--output_dir", out] + BEAM)
  assert summary["built"] == ["embedded_redpajama.book", "embedded_redpajama.c4",
                              "embedded_redpajama.wikipedia"]
  return out, summary


def test_beam_run_counts_records_and_keeps_a_complete_cache(rp_cache, capsys):
  out, summary = rp_cache
  for part, info in summary["parts"].items():
    assert info["records"]["train"]["ok"] == info["examples"]["train"] > 0, part
    assert set(info["records"]["train"]) == {"ok", "invalid_json", "missing_field",
                                             "empty_text", "invalid_utf8"}
    stats = json.load(open(os.path.join(out, part, "stats.train.json")))
    assert stats["examples"] == info["examples"]["train"] and stats["targets_tokens"] > 0
    # 1-2 source files per split: --min_shards' default, 64 shards each (round robin).
    manifest = json.load(open(os.path.join(out, part, caching.MANIFEST)))
    assert manifest["shards_per_file"] == {"train": 64, "validation": 64}
    assert json.load(open(os.path.join(out, part, "info.train.json")))["num_shards"] == (
        64 * len(manifest["identity"]["files"]["train"]))
  again = _cache(["--corpus", "embedded_redpajama", "--output_dir", out], capsys)
  assert again["built"] == [] and len(again["kept"]) == 3


@pytest.mark.parametrize("overrides", [
    {},  # DecLLM causal.
    {"model.family": "redllm"},  # RedLLM prefix split (middle).
    {"model.family": "redllm", "data.objective": "span_corruption", "data.extra_ids": "100",
     "model.vocab_size": "8292"},
])
def test_cached_redpajama_is_the_on_the_fly_redpajama(rp_cache, tmp_path, overrides):
  cfg = _cfg(**overrides)
  for hosts in (1, 2):
    assert_cached_equals_on_the_fly(cfg, rp_cache[0], tmp_path / str(hosts), num_shards=hosts)


def test_cached_flan_is_the_on_the_fly_flan(tmp_path, capsys):
  out = str(tmp_path / "flan_cache")
  summary = _cache(["--corpus", "embedded_flan", "--output_dir", out], capsys)
  assert len(summary["built"]) == 11  # One part per FLAN task.
  cfg = _cfg(**{"data.mixture": "embedded_flan", "model.family": "redllm"})
  for hosts in (1, 2):
    assert_cached_equals_on_the_fly(cfg, out, tmp_path / str(hosts), num_shards=hosts)


def test_cache_of_another_vocabulary_is_refused(tmp_path, capsys, spm_path):
  out = str(tmp_path / "other_vocab")
  _cache(["--corpus", "embedded_redpajama", "--output_dir", out,
          f"--config.data.vocab_path={spm_path}",
          '--config.data.mixture_rates={"book": 0, "wikipedia": 0}'], capsys)
  cfg = _cfg(**{"data.mixture": "embedded_redpajama.c4", "data.cache_dir": out})
  with pytest.raises(caching.CacheError, match=(
      r"embedded_redpajama.c4 was built from another vocabulary .*python -m "
      r"t5like.tools.cache_data --corpus embedded_redpajama")):
    pipeline.make_iterator(cfg, batch_size=2)


def test_command_line_errors_are_one_message(tmp_path):
  import subprocess
  import sys
  r = subprocess.run([sys.executable, "-m", "t5like.tools.cache_data", "--corpus", "redpajama",
                      "--output_dir", str(tmp_path)], capture_output=True, text=True, timeout=300)
  assert r.returncode == 2 and "give --data_dir" in r.stderr and "Traceback" not in r.stderr
