"""Config validation: wrong keys name the valid ones; impossible shapes fail early and clearly."""
import dataclasses

import pytest

from t5like.config import Config, ConfigError, apply_dict, apply_overrides, to_dict
from t5like.config.model import ModelConfig, paper_model


def test_unknown_key_lists_valid_keys():
  with pytest.raises(ConfigError) as e:
    apply_overrides(Config(), ["model.d_modle=256"])
  msg = str(e.value)
  assert "d_modle" in msg and "d_model" in msg and "num_heads" in msg
  with pytest.raises(ConfigError, match="Valid keys of config: .*data, .*model, train"):
    apply_overrides(Config(), ["modle.d_model=256"])


def test_overrides_are_typed():
  cfg = apply_overrides(Config(), ["model.d_model=256", "model.scan_layers=false",
                                   "model.dropout_rate=0.05", "model.family=redllm"])
  assert cfg.model.d_model == 256 and cfg.model.scan_layers is False
  assert cfg.model.dropout_rate == 0.05 and cfg.model.family == "redllm"
  with pytest.raises(ConfigError, match="expected an integer"):
    apply_overrides(Config(), ["model.d_model=big"])
  with pytest.raises(ConfigError, match="expected a boolean"):
    apply_overrides(Config(), ["model.qkv_norm=maybe"])
  with pytest.raises(ConfigError, match="key=value"):
    apply_overrides(Config(), ["model.d_model"])


def test_saved_config_round_trips():
  cfg = apply_overrides(Config(), ["model.d_model=256", "model.family=redllm"])
  fresh = apply_dict(Config(), to_dict(cfg))
  assert to_dict(fresh) == to_dict(cfg)


@pytest.mark.parametrize("changes,pattern", [
    (dict(head_dim=127), "head_dim=127 is odd; RoPE"),
    (dict(num_heads=6, num_kv_heads=4), "num_heads=6 is not a multiple of model.num_kv_heads=4"),
    (dict(family="redllm", num_encoder_layers=0), "at least one encoder and one decoder layer"),
    (dict(family="redllm", decoder_attention="prefix"), "DecLLM option"),
    (dict(family="t5"), "model.family='t5' is not one of 'decllm', 'redllm'"),
    (dict(mixed_attention="per_head", num_heads=3), "must be even"),
    (dict(remat_policy="some"), "model.remat_policy='some' is not one of"),
    (dict(d_model=0), "model.d_model must be > 0"),
    (dict(dropout_rate=1.0), r"dropout_rate must be in \[0, 1\)"),
])
def test_impossible_models_rejected(changes, pattern):
  with pytest.raises(ConfigError, match=pattern):
    dataclasses.replace(ModelConfig(), **changes).validate()


def test_paper_sizes_follow_the_table():
  cfg = paper_model("redllm", "2b")
  assert (cfg.d_model, cfg.num_heads, cfg.head_dim, cfg.d_ff) == (2560, 20, 128, 10240)
  assert (cfg.num_encoder_layers, cfg.num_decoder_layers, cfg.attn_out_norm) == (9, 9, True)
  assert paper_model("decllm", "8b").num_layers == 32
  with pytest.raises(ConfigError, match="valid sizes: 150m, 1b"):
    paper_model("decllm", "3b")
