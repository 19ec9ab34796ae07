"""DataConfig: defaults validate, overrides parse, nonsense is rejected with a useful message."""
import pytest

from t5like.config import Config, ConfigError, apply_overrides


def _cfg(*overrides):
  cfg = Config()
  apply_overrides(cfg, list(overrides))
  return cfg


def test_defaults_validate_and_rates_parse_from_json():
  cfg = _cfg('data.mixture_rates={"book": 2, "common_crawl": 0}', "data.prefix_split=random",
             "data.source=tfds", "data.bad_records=error")
  cfg.validate()
  assert cfg.data.mixture_rates == {"book": 2, "common_crawl": 0}
  assert cfg.data.prefix_split == "random" and cfg.data.source == "tfds"


@pytest.mark.parametrize("overrides, match", [
    (["data.objective=mlm"], "data.objective"),
    (["data.prefix_split=left"], "data.prefix_split"),
    (["data.source=parquet"], "data.source"),
    (["data.bad_records=ignore"], "data.bad_records"),
    (["data.inputs_length=0"], "data.inputs_length must be > 0"),
    (["data.shuffle_buffer_size=-1"], "data.shuffle_buffer_size"),
    (["data.mixture="], "data.mixture must name"),
    (["data.mixture=has space"], "not a valid seqio name"),
    (["data.mixture=redpajama_v1"], "set data.data_dir"),
    (["data.mixture=flan.sub.task"], "set data.data_dir"),
    (["data.mixture=embedded_flan", "data.data_dir=/x"], "would be ignored"),
    (["data.mixture=embedded_flan", "data.objective=causal"], "instruction corpus"),
    (["data.objective=inputs_targets"], "plain text"),
    (['data.mixture_rates={"book": -1}'], "must be >= 0"),
    (['data.mixture_rates={"book": "x"}'], "finite number"),
])
def test_rejects_nonsense(overrides, match):
  with pytest.raises(ConfigError, match=match):
    _cfg(*overrides).validate()
