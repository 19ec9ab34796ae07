"""``eval.py --suite experts`` on a tiny trained MoE checkpoint (embedded data): each subset's
distribution sums to one, its routed pairs are top_k x the real tokens of the same batches, its
counts equal the loads the model's own routing statistics report, and the report shows them."""
from __future__ import annotations

import json
import os
import sys

import jax
import numpy as np
import pytest
from flax import nnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "training"))
from train_helpers import REPO, run_training  # noqa: E402
from t5like.config import load_config  # noqa: E402
from t5like.models import moe  # noqa: E402


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  cfg = load_config(os.path.join(REPO, "configs", "tiny_decllm_moe.py"), [
      "model.d_model=64", "model.num_heads=2", "model.d_ff=256", "model.moe.expert_d_ff=32",
      "data.sequence_length=64", "train.steps=2", "train.batch_size=8", "train.eval_steps=0",
      "train.log_every=1", "checkpoint.every=2", "train.progress_bar=false"])
  path = str(tmp_path_factory.mktemp("moe_ckpt"))
  run_training(cfg, path, data="pipeline")
  return path


@pytest.mark.slow  # ~2 min on 2 cores: trains a checkpoint on the embedded data first.
def test_experts_suite_counts_match_direct_counts(workdir, tmp_path):
  from t5like.evaluation import experts
  from t5like.training.restore import restore_model
  from t5like.evaluation.suite import run_suite
  out = str(tmp_path / "suite")
  results = run_suite([workdir], ["experts", "ppl", "attention"], output_dir=out,
                      max_batches=2, expert_tokens="the .")
  for suite in ("ppl", "attention"):  # The other suites that need no generation run on MoE.
    assert "error" not in results["checkpoints"][workdir][suite], results
  res = results["checkpoints"][workdir]["experts"]
  assert "error" not in res, res
  model, cfg, _ = restore_model(workdir, overrides=["data.objective=prefix"])
  batches = experts.subset_batches(cfg, 8, 2)
  assert len(batches) > 1  # The embedded mixture's parts.
  k = cfg.model.moe.top_k
  assert set(res["layers"]) == {"decoder/0", "decoder/1"}
  for layer, a in res["layers"].items():
    for subset, dist in a["distribution"].items():
      np.testing.assert_allclose(sum(dist), 1.0, rtol=1e-9)
      real = sum(int(np.sum(np.asarray(b["decoder_target_tokens"]) > 0)) for b in batches[subset])
      assert a["pairs"][subset] == k * real, (layer, subset)
    assert 0 < a["entropy"] <= a["max_entropy"] + 1e-9
    assert len(a["top_tokens"]) == cfg.model.moe.num_experts
  # The counts against the loads of the model's routing statistics on the same batches.
  for subset, bs in batches.items():
    loads = {}
    for b in bs:
      m = nnx.merge(*nnx.split(model))
      with moe.collect_stats():
        m({k_: np.asarray(v) for k_, v in b.items()})
      for path, s in moe.pop_layer_stats(m).items():
        for i, load in enumerate(np.asarray(jax.device_get(s.load))):
          loads[f"decoder/{i}"] = loads.get(f"decoder/{i}", 0) + load
    for layer, a in res["layers"].items():
      want = np.asarray(loads[layer], np.float64) / float(np.sum(loads[layer]))
      np.testing.assert_allclose(a["distribution"][subset], want, rtol=1e-9)
  assert set(res["query_tokens"]) == {"the", "."}
  assert os.path.exists(os.path.join(out, res["heatmaps"]))
  report = open(os.path.join(out, "report.md")).read()
  assert "Expert assignment" in report and "decoder/1" in report
  json.loads(open(os.path.join(out, "results.json")).read())
