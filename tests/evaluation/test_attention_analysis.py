"""Attention maps recomputed layer by layer are the model's own; rank, Dong ratio and locality."""
from __future__ import annotations

import os
import sys

import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "models"))
from helpers import tiny_model, tokens  # noqa: E402
from numerics import assert_close_to_scale  # noqa: E402
from t5like.evaluation import attention_analysis as aa  # noqa: E402


def _prefix_batch():
  x = tokens((2, 10))
  return {"decoder_input_tokens": x, "decoder_causal_attention": jnp.array([[1] * 6 + [0] * 4] * 2)}


@pytest.mark.parametrize("attention", ["causal", "prefix"])
def test_decllm_walk_reproduces_the_models_logits(attention):
  model = tiny_model("decllm", decoder_attention=attention)
  batch = _prefix_batch()
  maps = aa.attention_maps(model, batch)
  assert [(m.stack, m.layer) for m in maps] == [("decoder", 0), ("decoder", 1)]
  logits = model.embedding.logits(model.final_norm(jnp.asarray(maps[-1].hidden_btd)))
  assert_close_to_scale(logits, model(batch))
  p = maps[0].probs_bhts
  np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-5)
  if attention == "causal":
    assert np.all(np.triu(p[0, 0], 1) == 0)
  else:  # The prefix attends to later prefix tokens, never to targets.
    assert p[0, 0, 0, 5] > 0 and np.all(p[0, 0, :6, 6:] == 0)
  # Analysed tokens: the prefix of the first segment, for every attention kind alike.
  assert maps[0].q_valid_bt[0].tolist() == [True] * 6 + [False] * 4


def test_redllm_walk_reproduces_logits_and_gives_cross_maps():
  model = tiny_model("redllm", mixed_attention="per_head")
  batch = {"encoder_input_tokens": tokens((1, 7), 1), "decoder_input_tokens": tokens((1, 5), 2)}
  maps = aa.attention_maps(model, batch)
  assert [m.stack for m in maps] == ["encoder", "encoder", "decoder_self", "cross",
                                     "decoder_self", "cross"]
  logits = model.embedding.logits(model.decoder_norm(jnp.asarray(maps[-1].hidden_btd)))
  assert_close_to_scale(logits, model(batch))
  enc = maps[0].probs_bhts[0]  # per_head mixing: heads 0-1 forward, 2-3 backward.
  assert np.all(np.triu(enc[0], 1) == 0) and np.all(np.tril(enc[3], -1) == 0)
  assert maps[3].probs_bhts.shape == (1, 4, 5, 7) and np.all(maps[3].probs_bhts > 0)


def test_rank_of_a_causal_map_with_positive_diagonal_is_full():
  rng = np.random.default_rng(0)
  scores = rng.normal(size=(32, 32)) * 3
  causal = np.tril(np.exp(scores))
  causal /= causal.sum(1, keepdims=True)
  assert aa.triangular_rank(causal) == 32 and aa.triangular_rank(causal.T) == 32
  assert aa.triangular_rank(np.exp(scores)) is None  # Not triangular: no exact shortcut.
  low = np.full((32, 32), 1 / 32)  # Uniform bidirectional attention: rank 1.
  assert aa.numerical_rank(low)[0] == 1 and aa.effective_rank(low) == pytest.approx(1.0)
  assert aa.numerical_rank(np.eye(32))[0] == 32 and aa.effective_rank(np.eye(32)) == pytest.approx(32)


def test_dong_ratio_and_distance_profile():
  same = np.tile(np.arange(4.0), (6, 1))
  assert aa.dong_residual_ratio(same) == 0.0
  assert aa.dong_residual_ratio(np.eye(6)) > 0.5
  local = np.eye(8)
  dist, hist = aa.distance_profile(local)
  assert dist == 0.0 and hist[0] == 1.0
  prev = np.eye(8, k=-1)
  dist, hist = aa.distance_profile(prev)
  assert dist == 1.0 and hist[1] == 1.0


def test_summary_has_a_row_per_sub_layer():
  model = tiny_model("decllm", decoder_attention="prefix")
  rows = aa.summarize(aa.attention_maps(model, _prefix_batch()))
  assert [(r["stack"], r["layer"]) for r in rows] == [("decoder", 0), ("decoder", 1)]
  assert all(0 < r["normalized_rank"] <= 1 and len(r["normalized_rank_per_head"]) == 4
             for r in rows)
  causal = aa.summarize(aa.attention_maps(tiny_model("decllm"), _prefix_batch()))
  assert all(r["triangular_full_rank_fraction"] == 1.0 for r in causal)
  assert all(r["triangular_full_rank_fraction"] == 0.0 for r in rows)  # Bidirectional prefix.


def _pipeline_batch(family):
  """Numpy rows as the pipeline gives them (``held_out_batch``): packed, with segment ids and
  positions; the cross mask built from numpy ids once reached the fused-core path."""
  seg = np.array([[1] * 5 + [2] * 3, [1] * 8], np.int32)
  pos = np.array([list(range(5)) + list(range(3)), list(range(8))], np.int32)
  batch = {"decoder_input_tokens": np.asarray(tokens((2, 8), 2)), "decoder_segment_ids": seg,
           "decoder_positions": pos}
  if family == "redllm":
    batch.update(encoder_input_tokens=np.asarray(tokens((2, 6), 1)),
                 encoder_segment_ids=np.array([[1] * 4 + [2] * 2, [1] * 6], np.int32),
                 encoder_positions=np.array([[0, 1, 2, 3, 0, 1], list(range(6))], np.int32))
  return batch


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_pipeline_batches_of_both_families_give_maps_and_a_png(family, tmp_path, monkeypatch):
  model = tiny_model(family, num_layers=3, num_encoder_layers=3, num_decoder_layers=3)
  maps = aa.attention_maps(model, _pipeline_batch(family))
  want = ["decoder"] if family == "decllm" else ["encoder", "decoder_self", "cross"]
  assert list(dict.fromkeys(m.stack for m in maps)) == want
  shown = aa.panels(maps)
  assert [(m.stack, m.layer) for m in shown] == [(s, i) for s in want for i in (0, 2)]
  from t5like.evaluation import plots
  figures = []
  save = plots.save
  monkeypatch.setattr(plots, "save",
                      lambda fig, path, **kw: (figures.append(fig), save(fig, path, **kw))[1])
  aa.plot_heads(shown, tmp_path / "maps.png", title="t")
  assert (tmp_path / "maps.png").stat().st_size > 0
  axes = figures[0].axes
  assert len(axes) == len(shown) * 4 + 1  # Heads x panels, and one colour bar.
  assert axes[-1].get_ylabel() == "attention probability"
