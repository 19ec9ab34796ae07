"""Instruction tuning starts from a pretrained checkpoint's parameters (fresh optimizer, step 0),
also across the DecLLM -> DecLLM + bidirectional prefix switch; mismatches fail before compiling.
"""
from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from t5like import partitioning
from t5like.config import ConfigError
from t5like.training import loop, state as state_lib, step_dirs
from t5like.training.data import SyntheticData
from train_helpers import load_checkpoint_arrays, read_metrics, tiny_config

PRETRAIN_STEPS = 30


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("pretrain")
  cfg = tiny_config("decllm", steps=PRETRAIN_STEPS)
  cfg.train.log_every = 1
  result = loop.run(cfg, str(workdir), data=SyntheticData(cfg))
  return workdir, result


def _finetune_config(pretrained_dir, *, prefix=True, family="decllm"):
  cfg = tiny_config(family, prefix=prefix, steps=3)
  cfg.train.schedule, cfg.train.learning_rate, cfg.train.z_loss = "constant", 1e-3, 0.0
  cfg.model.dropout_rate = 0.05
  cfg.train.init_from = str(pretrained_dir)
  return cfg


def test_initial_state_holds_the_pretrained_parameters(pretrained):
  workdir, _ = pretrained
  cfg = _finetune_config(workdir)
  setup = state_lib.build_setup(cfg, partitioning.make_mesh(cfg.mesh))
  step_dir = step_dirs.resolve_step_dir(str(workdir))
  assert step_dir.endswith(f"checkpoints/{PRETRAIN_STEPS}")
  params = step_dirs.restore_params(step_dir, setup.abstract_state.params)
  state = state_lib.fresh_state_from_params(setup, params)
  saved = load_checkpoint_arrays(str(workdir), PRETRAIN_STEPS)
  flat = jax.tree_util.tree_flatten_with_path(jax.device_get(state.params))[0]
  assert flat
  for path, value in flat:
    np.testing.assert_array_equal(value, saved["['params']" + jax.tree_util.keystr(path)])
  assert int(state.step) == 0 and int(state.skipped_steps) == 0
  counts = [int(v) for k, v in jax.tree_util.tree_flatten_with_path(
      jax.device_get(state.opt_state))[0] if "count" in jax.tree_util.keystr(k)]
  assert counts and all(c == 0 for c in counts)  # A fresh optimizer, not the pretraining one.


def test_finetuning_run_starts_where_pretraining_ended(pretrained, tmp_path):
  workdir, pre = pretrained
  first_pretrain_loss = read_metrics(str(workdir))[0]["loss"]
  cfg = _finetune_config(workdir)
  result = loop.run(cfg, str(tmp_path), data=SyntheticData(cfg))
  assert result["resumed_from_step"] is None and result["step"] == 3
  first = read_metrics(str(tmp_path))[0]
  assert first["step"] == 1
  # From random parameters the loss starts near log(vocab); from the pretrained ones far lower.
  assert first_pretrain_loss > np.log(128) - 0.5
  assert first["loss"] < first_pretrain_loss - 1.0
  assert abs(first["loss"] - pre["loss"]) < 1.0
  with open(tmp_path / "train.log") as f:
    assert "initialised parameters from" in f.read()
  # Every metric the issue lists is logged (jsonl) and TensorBoard events are written.
  for key in ("loss", "z_loss", "accuracy", "learning_rate", "grad_norm", "tokens_per_sec",
              "step_time_s", "mfu"):
    assert key in first, key
  assert first["learning_rate"] == pytest.approx(1e-3)
  assert any(f.startswith("events.out.tfevents") for f in os.listdir(tmp_path / "tensorboard"))


def test_other_architecture_fails_before_compiling(pretrained, tmp_path):
  workdir, _ = pretrained
  with pytest.raises(ConfigError, match="model.family"):
    loop.run(_finetune_config(workdir, family="redllm", prefix=False), str(tmp_path / "a"),
             data=SyntheticData(tiny_config("redllm")))
