"""Config files, train/checkpoint/distributed config validation, the CLI's argument parsing."""
from __future__ import annotations

import glob
import os

import pytest

from cli_scripts import load_script
from t5like.config import ConfigError, load_config
from train_helpers import REPO

CONFIGS = sorted(glob.glob(os.path.join(REPO, "configs", "*.py")))
SIZES = ("150m", "1b", "2b", "4b", "8b")


def _load(name: str, *overrides: str):
  return load_config(os.path.join(REPO, "configs", name), overrides)


def _load_any(path: str):
  name = os.path.basename(path)
  extra = []
  if not name.startswith("tiny_"):
    extra.append("data.data_dir=/data/flan" if "flan" in name else "data.data_dir=/data/rp")
  return load_config(path, extra)


def test_every_config_file_loads():
  names = {os.path.basename(p) for p in CONFIGS}
  for fam in ("decllm", "redllm"):
    for size in SIZES:
      assert f"{fam}_{size}.py" in names
      assert f"{fam}_{size}_flan.py" in names
    assert f"tiny_{fam}.py" in names and f"tiny_{fam}_flan.py" in names
  assert {"tiny_decllm_prefix.py", "tiny_decllm_prefix_flan.py"} <= names
  assert all(f"decllm_prefix_{s}_flan.py" in names for s in SIZES)
  for path in CONFIGS:
    cfg = _load_any(path)
    assert cfg.train.batch_size % cfg.train.microbatches == 0


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_paper_pretraining_hyperparameters(family):
  cfg = _load(f"{family}_1b.py", "data.data_dir=/data/rp")
  t = cfg.train
  assert (t.steps, t.batch_size) == (400_000, 2048)
  assert (t.schedule, t.learning_rate, t.warmup_steps, t.final_lr_fraction) == (
      "warmup_cosine", 0.01, 2000, 0.1)
  assert (t.adafactor_decay_rate, t.clip_grad_norm, t.z_loss) == (0.8, 1.0, 1e-4)
  assert cfg.model.dropout_rate == 0.0 and cfg.model.dtype == "bfloat16"
  assert cfg.model.param_dtype == "float32"
  assert (cfg.model.d_model, cfg.model.num_heads, cfg.model.vocab_size) == (2048, 16, 32768)
  if family == "decllm":
    assert cfg.data.sequence_length == 2048 and cfg.model.num_layers == 16
  else:
    assert (cfg.data.inputs_length, cfg.data.targets_length) == (1024, 1024)
    assert (cfg.model.num_encoder_layers, cfg.model.num_decoder_layers) == (7, 7)
    assert cfg.data.prefix_split == "middle" and cfg.model.attn_out_norm


@pytest.mark.parametrize("name,family,attention", [
    ("decllm_2b_flan.py", "decllm", "causal"), ("decllm_prefix_2b_flan.py", "decllm", "prefix"),
    ("redllm_2b_flan.py", "redllm", "causal")])
def test_paper_instruction_tuning_hyperparameters(name, family, attention):
  cfg = _load(name, "data.data_dir=/data/flan")
  t = cfg.train
  assert (t.steps, t.batch_size, t.schedule, t.learning_rate) == (190_000, 1024, "constant", 1e-3)
  assert t.z_loss == 0.0 and cfg.model.dropout_rate == 0.05
  assert (cfg.data.inputs_length, cfg.data.targets_length) == (2048, 512)
  assert cfg.data.objective == "inputs_targets"
  assert (cfg.model.family, cfg.model.decoder_attention) == (family, attention)


def test_paper_config_without_data_dir_says_what_to_set():
  with pytest.raises(ConfigError, match="data_dir"):
    _load("decllm_150m.py")


def test_tiny_configs_are_cpu_sized():
  for name in ("tiny_decllm.py", "tiny_redllm.py", "tiny_decllm_prefix.py"):
    cfg = _load(name)
    assert cfg.model.dtype == "float32" and cfg.model.vocab_size == 8192
    assert cfg.data.mixture == "embedded_redpajama" and cfg.train.steps <= 1000
  assert _load("tiny_decllm_prefix.py").model.decoder_attention == "prefix"
  flan = _load("tiny_redllm_flan.py")
  assert flan.data.mixture == "embedded_flan" and flan.train.schedule == "constant"


@pytest.mark.parametrize("override,match", [
    ("train.microbatches=3", "microbatches"),
    ("checkpoint.keep=1", "keep at least 2"),
    ("train.warmup_steps=-1", "warmup_steps"),
    ("train.adafactor_decay_rate=1.5", "decay_rate"),
    ("distributed.mode=maybe", "distributed.mode"),
    ("distributed.local_device_ids=a,b", "local_device_ids"),
    ("train.max_nonfinite_steps=0", "max_nonfinite_steps"),
])
def test_bad_train_values_are_rejected_with_the_key(override, match):
  with pytest.raises(ConfigError, match=match):
    _load("tiny_decllm.py", override)


def test_cli_parses_overrides_in_both_forms():
  cli = load_script("train.py")
  args, overrides = cli.parse_args(["--workdir", "/tmp/x", "--config.train.steps=7",
                                    "--config.mesh.fsdp", "2"])
  assert args.workdir == "/tmp/x" and args.config.endswith("configs/tiny_decllm.py")
  assert overrides == ["train.steps=7", "mesh.fsdp=2"]
  with pytest.raises(SystemExit):
    cli.parse_args(["--bogus=1"])
  assert cli.main(["--config", os.path.join(REPO, "configs", "tiny_redllm.py"),
                   "--print_config", "--config.train.steps=3"]) == 0
  assert cli.main(["--config.train.nope=3"]) == 2
