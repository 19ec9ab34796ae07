"""The paper presets run: each ``configs/<family>_150m[_flan].py`` with its model shrunk by overrides
(and nothing else of its data settings changed but the shuffle buffer: lengths 2048 / 1024+1024 /
2048+512, stream chunking, objective, mixing) trains a few steps on a generated corpus of the
paper's shape, through its first held-out eval and a checkpoint. The paper's buffer of 1,000
rows per task is a minute of CPU to fill on the first batch here and checks nothing; 16 keeps
the shuffle on.

The data flags a user must give are given as a user would: ``data.data_dir``, ``data.vocab_path``
(the embedded 8,192-piece model, so ``model.vocab_size`` is shrunk with the model) and
``data.validation_holdout`` (the generated RedPajama has no validation files; some FLAN tasks do;
30% so that the tiny corpus holds out a full 2048-token stream of each subset).
All five distinct data set-ups run with ``-m slow`` (each a minute or more: the paper pipeline's
cold start of 7 subsets or 5 FLAN sub-mixtures, and a first checkpoint that waits on its warm-up,
docs/data.md); the default suite checks that a preset without validation data, or without
a vocabulary, stops with the flag to set before anything compiles. The presets' data at paper
lengths is checked by tests/data/test_paper_scale.py.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from t5like.config import ConfigError, load_config
from t5like.data import vocab
from t5like.tools import make_paper_corpus
from t5like.training import loop
from train_helpers import REPO, read_metrics

SHRINK = [  # The model only: 2 layers of d_model 64 instead of the 150M model.
    f"model.vocab_size={vocab.EMBEDDED_VOCAB_SIZE}", "model.d_model=64", "model.num_heads=2",
    "model.num_kv_heads=2", "model.head_dim=32", "model.d_ff=128", "model.num_layers=2",
    "model.num_encoder_layers=1", "model.num_decoder_layers=1", "model.dtype=float32",
    "model.remat_policy=none"]
LOOP = [  # Two steps with an eval and a checkpoint after the first.
    "train.steps=2", "train.batch_size=2", "train.eval_every=1", "train.eval_steps=1",
    "train.eval_batch_size=2", "train.log_every=1", "train.warmup_steps=1",
    "checkpoint.every=1", "train.progress_bar=false", "data.shuffle_buffer_size=16"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
  root = tmp_path_factory.mktemp("paper_corpus")
  make_paper_corpus.write_redpajama(str(root / "redpajama"), scale=0.001, max_words=20_000)
  make_paper_corpus.write_flan(str(root / "flan"), tasks=12, max_examples=60)
  return str(root)


def _preset(name: str, corpus: str, *extra: str):
  flan = name.endswith("_flan.py")
  data = [f"data.data_dir={os.path.join(corpus, 'flan' if flan else 'redpajama')}",
          f"data.vocab_path={vocab.EMBEDDED_VOCAB}", "data.validation_holdout=0.3"]
  return load_config(os.path.join(REPO, "configs", name), data + SHRINK + LOOP + list(extra))


def _run(name: str, corpus: str, workdir: str) -> None:
  cfg = _preset(name, corpus)
  paper = load_config(os.path.join(REPO, "configs", name),
                      [f"data.data_dir={cfg.data.data_dir}"])
  assert cfg.data == paper.data.__class__(**{
      **paper.data.__dict__, "data_dir": cfg.data.data_dir, "vocab_path": cfg.data.vocab_path,
      "validation_holdout": 0.3, "shuffle_buffer_size": 16})  # User flags + the buffer.
  result = loop.run(cfg, workdir)
  assert result["step"] == 2 and np.isfinite(result["eval_loss"])
  from t5like.data import held_out
  parts = held_out.parts(cfg)  # eval_steps=1: one batch of every part, combined by rate
  scored = [p for p in parts if f"eval/{p.name}/loss" in result]  # (a tiny corpus may hold
  assert result["eval_batches"] == len(scored) > 1  # out no rows of a part: left out).
  assert result["eval_loss"] == pytest.approx(sum(
      p.rate * result[f"eval/{p.name}/loss"] for p in scored) / sum(p.rate for p in scored),
      rel=1e-6)
  evals = [m for m in read_metrics(workdir) if "eval_loss" in m]
  assert evals and evals[0]["step"] == 1  # The first eval came at step 1, before the end.
  steps = sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())
  assert 2 in steps


@pytest.mark.slow
@pytest.mark.parametrize("name", ["redllm_150m.py", "decllm_150m.py", "decllm_150m_flan.py",
                                  "decllm_prefix_150m_flan.py", "redllm_150m_flan.py"])
def test_paper_presets_run_through_eval_and_checkpoint(name, corpus, tmp_path):
  _run(name, corpus, str(tmp_path))


def test_paper_preset_without_validation_data_stops_before_compiling(corpus, tmp_path,
                                                                      monkeypatch):
  from t5like.training import state as state_lib

  monkeypatch.setattr(state_lib, "build_setup", lambda *a, **k: pytest.fail("compiled"))
  cfg = _preset("decllm_150m.py", corpus, "data.validation_holdout=0")
  with pytest.raises(ConfigError, match="validation_holdout=0.001.*validation_dir"):
    loop.run(cfg, str(tmp_path))
  cfg = _preset("decllm_150m.py", corpus, "data.vocab_path=")
  with pytest.raises(ConfigError, match="data.vocab_path is empty.*build_vocab"):
    loop.run(cfg, str(tmp_path))
