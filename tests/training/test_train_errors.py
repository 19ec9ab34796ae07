"""Misconfigurations fail before anything is compiled, with a message saying what to change.
(Multi-device cases — batch vs data shards — are in test_train_multidevice.py.)"""
from __future__ import annotations

import json
import os

import pytest

from t5like.config import ConfigError
from t5like.training import loop, state as state_lib
from t5like.training.data import SyntheticData
from train_helpers import tiny_config


@pytest.fixture
def no_compile(monkeypatch):
  """Fails the test if the run gets as far as building the train state."""
  def boom(*args, **kwargs):
    raise AssertionError("the run got past its checks and started building the model")
  monkeypatch.setattr(state_lib, "build_setup", boom)


def test_missing_data_fails_before_compiling(tmp_path, no_compile):
  cfg = tiny_config("decllm")
  cfg.model.vocab_size = 8192
  cfg.data.mixture, cfg.data.data_dir = "redpajama_v1", str(tmp_path / "no_such_corpus")
  with pytest.raises(ConfigError, match="no_such_corpus.*does not exist"):
    loop.run(cfg.validate(), str(tmp_path / "run"))


def test_mesh_larger_than_the_machine_fails_before_compiling(tmp_path, no_compile):
  cfg = tiny_config("decllm")
  cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor = 1, 1, 2
  with pytest.raises(ConfigError, match="uses 2 devices but 1 are available"):
    loop.run(cfg, str(tmp_path), data=SyntheticData(cfg))


def test_missing_init_checkpoint_fails_before_compiling(tmp_path, no_compile):
  cfg = tiny_config("decllm")
  cfg.train.init_from = str(tmp_path / "pretrained")
  with pytest.raises(ConfigError, match="no such directory"):
    loop.run(cfg, str(tmp_path / "run"), data=SyntheticData(cfg))
  os.makedirs(tmp_path / "empty")
  cfg.train.init_from = str(tmp_path / "empty")
  with pytest.raises(ConfigError, match="holds no checkpoint"):
    loop.run(cfg, str(tmp_path / "run"), data=SyntheticData(cfg))


def test_resuming_with_other_data_settings_is_an_error_not_corruption(tmp_path):
  cfg = tiny_config("decllm", steps=2)
  cfg.train.decay_steps = 20  # The schedule (so the program) of the default tiny_config: cached.
  cfg.checkpoint.every = 0
  loop.run(cfg, str(tmp_path), data=SyntheticData(cfg))
  cfg.train.steps = 4
  cfg.data.seed = 1  # The saved data position belongs to seed 0.
  with pytest.raises(ConfigError, match="data settings"):
    loop.run(cfg, str(tmp_path), data=SyntheticData(cfg))
  assert os.path.isdir(tmp_path / "checkpoints" / "2")  # Not moved aside as corrupt.
  assert not os.path.exists(tmp_path / "corrupt_checkpoints")
  cfg.checkpoint.restore_data = False  # The documented way out: keep the state, new data.
  # The checkpoint as one written before train.adafactor_per_layer existed (whole-stack RMS):
  # resuming warns that the optimizer now behaves otherwise.
  meta = tmp_path / "checkpoints" / "2" / "config" / "metadata"
  saved = json.loads(meta.read_text())
  del saved["train"]["adafactor_per_layer"]
  meta.write_text(json.dumps(saved))
  result = loop.run(cfg, str(tmp_path), data=SyntheticData(cfg))
  assert result["resumed_from_step"] == 2 and result["step"] == 4
  assert ("WARNING resuming with another optimizer setting than the checkpoint was trained with "
          "(train.adafactor_per_layer: checkpoint False vs config True)"
          in (tmp_path / "train.log").read_text())


def test_cudnn_attention_off_a_gpu_is_a_config_error_before_the_first_step(tmp_path):
  """Packed rows with attention_impl='cudnn' need an NVIDIA GPU (Hopper or newer): elsewhere
  the step's tracing stops with a ConfigError naming 'reference' (the CLIs print one error block)."""
  cfg = tiny_config(steps=1, batch_size=2, length=16)
  cfg.model.attention_impl, cfg.model.dtype = "cudnn", "bfloat16"
  cfg.validate()
  with pytest.raises(ConfigError, match="runs on NVIDIA GPUs.*'reference'"):
    loop.run(cfg, str(tmp_path), data=SyntheticData(cfg))
