"""The MoE experiment: its spec builds for both budgets, and its analysis applies the written
rule (same sign beyond the noise: supported; opposite: contradicted; else inconclusive)."""
from __future__ import annotations

import os

from t5like.experiments import moe
from t5like.experiments.__main__ import load_experiment


def _results(losses):
  return {f"{f}_{ffn}_{s}": {"eval_loss": loss, "tags": {"family": f, "ffn": ffn, "seed": s}}
          for (f, ffn, s), loss in losses.items()}


def test_moe_spec_builds_and_pairs_every_arm():
  for budget in ("quick", "full"):
    spec = load_experiment("moe", budget)
    arms = {(r.tag("family"), r.tag("ffn")) for r in spec.runs}
    assert arms == {("decllm", "dense"), ("decllm", "moe"), ("redllm", "dense"),
                    ("redllm", "moe")}
    assert all(r.eval_overrides == ("data.objective=prefix",) for r in spec.runs)


def test_moe_analysis_applies_the_rule(tmp_path):
  spec = load_experiment("moe", "full")
  def arms(red_dense, red_moe):
    out = {}
    for s, eps in enumerate((0.0, 0.01)):
      out.update({("decllm", "dense", s): 5.0 + eps, ("decllm", "moe", s): 4.9 + eps,
                  ("redllm", "dense", s): red_dense + eps, ("redllm", "moe", s): red_moe + eps})
    return _results(out)
  same = moe.analyse(spec, arms(4.8, 4.7), str(tmp_path))
  assert [v.verdict for v in same.verdicts] == ["supported"]
  assert os.path.exists(tmp_path / "moe.png")
  assert [v.verdict for v in moe.analyse(spec, arms(4.8, 5.1), str(tmp_path)).verdicts] == [
      "contradicted"]
  assert [v.verdict for v in moe.analyse(spec, arms(5.0, 4.7), str(tmp_path)).verdicts] == [
      "inconclusive"]  # No dense difference beyond the noise.
  one_seed = _results({("decllm", "dense", 0): 5.0, ("decllm", "moe", 0): 4.9,
                       ("redllm", "dense", 0): 4.0, ("redllm", "moe", 0): 3.9})
  assert [v.verdict for v in moe.analyse(spec, one_seed, str(tmp_path)).verdicts] == [
      "inconclusive"]
