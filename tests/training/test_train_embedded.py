"""End to end on the embedded real data (seqio pipeline): the held-out loss of a tiny DecLLM and a
tiny RedLLM falls well below the unigram entropy of the embedded corpus's target tokens.

The default suite runs a shrunk RedLLM (about a minute) through ``train.py`` itself, as a user
starts it (TensorFlow's and JAX's logging left as they are), so the same run also checks that a
CPU run prints no error-level log line (tests/test_quiet_startup.py has the rest of that check).
``-m slow`` runs the same for DecLLM and the shipped ``configs/tiny_*.py`` as they are (minutes).
One family by default keeps the suite under its 15 minutes: the optimizer, loss and pipeline that
learning needs are shared, and DecLLM's training is exercised end to end by the default suite's
bit-exact SIGKILL resume on this pipeline (tests/training/test_train_resume.py).
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from t5like.config import load_config
from t5like.training import startup
from t5like.training.data import PipelineData, unigram_entropy
from test_quiet_startup import error_lines
from train_helpers import REPO, read_metrics, run_training, subprocess_env


def _held_out_entropy(cfg) -> float:
  """Unigram entropy of the target tokens of the whole validation split (~250k tokens)."""
  it = PipelineData(cfg).eval(64, 0, 1)
  batches = list(it)
  it.close()
  return unigram_entropy(batches)


def _quick_overrides(steps: int) -> list[str]:
  """The shipped tiny config, shrunk: d_model 64, 64-token rows, ``steps`` steps of 8 rows."""
  return ["model.d_model=64", "model.num_heads=2", "model.d_ff=256", "model.num_layers=2",
          "model.num_encoder_layers=1", "model.num_decoder_layers=1", "data.sequence_length=64",
          "data.inputs_length=32", "data.targets_length=32", f"train.steps={steps}",
          "train.warmup_steps=10", "train.batch_size=8", "train.eval_steps=4",
          "train.eval_every=0", "train.log_every=50", "checkpoint.every=0",
          "train.progress_bar=false"]


def _train_py(config: str, overrides: list[str], workdir: str) -> subprocess.CompletedProcess:
  """``python train.py`` as a user runs it: XLA's default optimisation (a few hundred steps run
  ~3x faster than with the suite's fast-compile flags; tests/fast_compile.py) and TensorFlow's
  C++ logging at its default level."""
  env = subprocess_env(optimize=True)
  del env["TF_CPP_MIN_LOG_LEVEL"]
  proc = subprocess.run([sys.executable, os.path.join(REPO, "train.py"), "--config",
                         os.path.join(REPO, "configs", config), "--workdir", workdir,
                         *[f"--config.{o}" for o in overrides]],
                        cwd=workdir, env=env, capture_output=True, text=True, timeout=500)
  assert proc.returncode == 0, proc.stderr[-5000:]
  return proc


# RedLLM gets more steps: it sees half as many target tokens per row (32 of 64).
# DecLLM's case guards a new user's main path (train.py learns, starts quietly) in make test.
@pytest.mark.parametrize("name,steps", [("tiny_decllm.py", 200),
                                        pytest.param("tiny_redllm.py", 300, marks=pytest.mark.slow)])
def test_loss_falls_well_below_unigram_entropy(name, steps, tmp_path):
  overrides = _quick_overrides(steps)
  cfg = load_config(os.path.join(REPO, "configs", name), overrides)
  entropy = _held_out_entropy(cfg)
  assert 6.0 < entropy < 8.0  # ~6.8 nats for the 8k SentencePiece vocab on this corpus.
  proc = _train_py(name, overrides, str(tmp_path))
  assert error_lines(proc.stderr) == []  # A CPU run starts (and trains) quietly.
  assert [name for name, _ in startup.parse(proc.stderr)] == [  # Where start-up time went.
      "imports", "data pipeline ready", "state built", "compiled", "first step"]
  metrics = read_metrics(str(tmp_path))
  assert metrics[0]["loss"] > entropy  # It starts above the unigram baseline (random init)...
  (final,) = [m for m in metrics if "eval_loss" in m]  # eval_every=0: one eval, at the end.
  assert final["step"] == steps and final["eval_batches"] == cfg.train.eval_steps
  print(f"{name}: held-out loss {final['eval_loss']:.3f}, unigram entropy {entropy:.3f}")
  assert final["eval_loss"] < entropy - 0.5, (final["eval_loss"], entropy)  # ...ends below.


# Nats below the unigram entropy the 500-step shipped runs must reach. Measured on a fresh clone
# (2 AMD EPYC Zen 3 cores, 2026-12-02): DecLLM 5.480 vs 6.786 (1.31 below), RedLLM 5.785 vs 6.769
# (0.98 below, on its target halves only, which see half the tokens of DecLLM's rows; 5.780
# before the accelerator-first ops change, so no regression of it).
MARGIN = {"tiny_decllm.py": 1.0, "tiny_redllm.py": 0.75}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny_decllm.py", "tiny_redllm.py"])
def test_shipped_tiny_configs_learn_the_embedded_corpus(name, tmp_path):
  cfg = load_config(os.path.join(REPO, "configs", name), ["train.progress_bar=false"])
  entropy = _held_out_entropy(cfg)
  result = run_training(cfg, str(tmp_path), data="pipeline", optimize=True, timeout=590)
  print(f"{name}: held-out loss {result['eval_loss']:.3f}, unigram entropy {entropy:.3f}")
  assert result["eval_loss"] < entropy - MARGIN[name], (result["eval_loss"], entropy)
