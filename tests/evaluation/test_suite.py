"""Inference-cost arithmetic, a memorising model picks the right option, and the whole suite on a
trained checkpoint (slow)."""
from __future__ import annotations

import json
import os
import sys

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "models"))
from helpers import tiny_cfg, tiny_model  # noqa: E402
from t5like.evaluation import cost, scoring  # noqa: E402
from t5like.models import cross_entropy_with_z_loss  # noqa: E402


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_inference_flops_grow_with_both_lengths(family):
  cfg = tiny_cfg(family)
  f = lambda n, m: cost.inference_flops(cfg, n, m)  # noqa: E731
  assert f(128, 64)["total"] == f(128, 64)["prefill"] + f(128, 64)["decode"]
  assert f(128, 64)["total"] < f(256, 64)["total"] < f(256, 128)["total"]
  assert f(128, 64)["prefill"] == f(128, 128)["prefill"]  # Decoding does not change prefill.
  # One decoded token of a DecLLM costs its layers + attention over the cache + logits.
  if family == "decllm":
    d, h, k, ff, v = 32, 4, 8, 64, 97
    one = cfg.num_layers * (2 * d * 4 * h * k + 6 * d * ff + 4 * (10 + 1) * h * k) + 2 * d * v
    assert f(10, 1)["decode"] == one


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_a_model_that_memorised_the_answers_picks_them(family):
  contexts = [[5, 6, 7], [8, 9, 10], [11, 12, 13], [14, 15, 16]]
  answers = [[40, 41], [50, 51], [60, 61], [70, 71]]
  model = tiny_model(family, seed=1)
  graphdef, params = nnx.split(model, nnx.Param)
  if family == "redllm":
    batch = {"encoder_input_tokens": jnp.asarray(contexts),
             "decoder_input_tokens": jnp.asarray([[0] + a[:-1] for a in answers])}
    targets, weights = jnp.asarray(answers), None
  else:
    seqs = [c + a for c, a in zip(contexts, answers)]
    batch = {"decoder_input_tokens": jnp.asarray([[0] + s[:-1] for s in seqs])}
    targets = jnp.asarray(seqs)
    weights = jnp.asarray([[0.0] * 3 + [1.0] * 2] * 4)
  opt = optax.adam(3e-2)
  state = opt.init(params)

  @jax.jit
  def step(p, s):
    loss_fn = lambda p: cross_entropy_with_z_loss(  # noqa: E731
        nnx.merge(graphdef, p)(batch), targets, weights, 0.0).loss
    g = jax.grad(loss_fn)(p)
    updates, s = opt.update(g, s)
    return optax.apply_updates(p, updates), s
  for _ in range(150):
    params, state = step(params, state)
  trained = nnx.merge(graphdef, params)
  for i, ctx in enumerate(contexts):
    ll = scoring.option_loglikelihoods(trained, [(ctx, a) for a in answers])
    assert max(range(4), key=ll.__getitem__) == i, (i, ll)


@pytest.mark.slow
def test_suite_end_to_end_on_trained_checkpoints(tmp_path):
  from t5like.config import load_config
  from t5like.evaluation.suite import run_suite
  from t5like.training import run
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  paths = []
  for family in ("decllm", "redllm"):
    cfg = load_config(os.path.join(root, "configs", f"tiny_{family}.py"),
                      ["train.steps=2", "train.batch_size=2", "train.eval_steps=0",
                       "checkpoint.every=2", "model.d_model=32", "model.num_heads=1",
                       "model.d_ff=64"])
    paths.append(str(tmp_path / family))
    run(cfg, paths[-1])
  res = run_suite(paths, ["ppl", "tasks", "length", "cost", "attention"],
                  output_dir=str(tmp_path / "out"), shots=[0, 1], max_batches=1)
  for p in paths:
    c = res["checkpoints"][p]
    assert set(c["length"]["loss"]) == {"x1", "x2", "x4", "x8"}
    assert "multiple_choice_grade" in c["tasks"]["tasks"]["antonyms"]["1-shot"]
    assert c["attention"]["layers"] and c["ppl"]["eval_tokens"] > 0
  saved = json.loads((tmp_path / "out" / "results.json").read_text())
  assert set(saved["task_files"].values()) and saved["plots"] == ["length_extrapolation.png",
                                                                  "tasks.png",
                                                                  "quality_vs_cost.png"]
  assert "## Length extrapolation" in (tmp_path / "out" / "report.md").read_text()


def test_tasks_suite_plots_grades_with_intervals_per_task_and_checkpoint(tmp_path, monkeypatch):
  """tasks.png: one bar group per task and shot count, one bar per checkpoint, its height the
  grade and its error bar 1.96 standard errors."""
  import matplotlib.image
  from t5like.evaluation import report
  grades = {"dec": {"antonyms": (0.75, 0.1), "small_sums": (0.25, 0.05)},
            "red": {"antonyms": (0.5, 0.2), "small_sums": (0.0, 0.0)}}
  results = {"suites": ["tasks"], "shots": [0], "checkpoints": {
      f"/runs/{c}": {"family": c, "step": 3, "tasks": {"tasks": {
          "antonyms": {"0-shot": {"multiple_choice_grade": g["antonyms"][0],
                                  "multiple_choice_grade_stderr": g["antonyms"][1]}},
          "small_sums": {"0-shot": {"exact_str_match": g["small_sums"][0],
                                    "exact_str_match_stderr": g["small_sums"][1]}},
          "broken": {"0-shot": {"error": "x"}}}}} for c, g in grades.items()}}
  figures = []
  save = report.save
  monkeypatch.setattr(report, "save", lambda fig, path: figures.append(fig) or save(fig, path))
  assert report.plots(results, str(tmp_path)) == ["tasks.png"]
  assert matplotlib.image.imread(str(tmp_path / "tasks.png")).shape[0] > 100
  ax = figures[0].axes[0]
  assert [t.get_text() for t in ax.get_xticklabels()] == ["antonyms 0-shot", "small_sums 0-shot"]
  bars = [c for c in ax.containers if hasattr(c, "patches")]
  assert len(bars) == 2 and all(len(b.patches) == 2 for b in bars)  # 2 checkpoints x 2 groups.
  for bar, g in zip(bars, grades.values()):
    assert [p.get_height() for p in bar.patches] == [g["antonyms"][0], g["small_sums"][0]]
    segs = bar.errorbar.lines[2][0].get_segments()
    assert [s[1][1] - s[0][1] for s in segs] == pytest.approx(
        [2 * 1.96 * g["antonyms"][1], 2 * 1.96 * g["small_sums"][1]])
  assert [t.get_text() for t in ax.get_legend().get_texts()] == [
      "dec (dec, step 3)", "red (red, step 3)"]
