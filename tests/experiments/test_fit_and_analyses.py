"""Power-law fits recover known exponents; the analyses apply their written rules to results."""
from __future__ import annotations

import numpy as np
import pytest

from t5like.experiments import fit, mixed, scaling
from t5like.experiments.spec import ExperimentSpec, RunSpec


def test_power_law_fit_recovers_known_exponents_with_covering_intervals():
  rng = np.random.default_rng(0)
  covered = 0
  for trial in range(40):
    x = np.geomspace(1e6, 1e9, 6)
    y = 50.0 * x ** -0.2 * np.exp(rng.normal(0, 0.01, x.shape))
    f = fit.fit_power_law(x, y)
    assert abs(f.exponent - 0.2) < 0.02 and f.r2 > 0.98
    covered += f.exponent_ci[0] <= 0.2 <= f.exponent_ci[1]
  assert covered >= 34  # A 95% interval covers the truth in ~38 of 40 trials.
  exact = fit.fit_power_law([1, 10, 100, 1000], [3.0, 3.0 * 10 ** -0.24, 3.0 * 100 ** -0.24,
                                                  3.0 * 1000 ** -0.24])
  assert exact.exponent == pytest.approx(0.24, abs=1e-9) and exact.coef == pytest.approx(3.0)


def test_power_law_fit_rejects_too_few_points():
  with pytest.raises(ValueError, match=">= 3 distinct"):
    fit.fit_power_law([1, 1, 2], [3.0, 2.9, 2.5])


def test_pareto_frontier_keeps_only_undominated_points():
  pts = [(1, 5.0, "a"), (2, 4.0, "b"), (3, 4.5, "a"), (4, 3.0, "a"), (5, 3.5, "b")]
  assert fit.pareto_frontier(pts) == [(1, 5.0, "a"), (2, 4.0, "b"), (4, 3.0, "a")]


def _scaling_results(alpha_dec, alpha_red, red_offset, noise=0.002, seed=0):
  rng = np.random.default_rng(seed)
  out = {}
  for fam, alpha, off in (("decllm", alpha_dec, 1.0), ("redllm", alpha_red, red_offset)):
    for i, p in enumerate(np.geomspace(1e5, 1e7, 5)):
      flops = 6 * p * 1e6
      out[f"{fam}{i}"] = {
          "name": f"{fam}{i}", "family": fam, "params": p * 2, "non_embedding_params": p,
          "train_flops": flops, "train_tokens": 1e6,
          "eval_loss": off * 40 * flops ** -alpha * np.exp(rng.normal(0, noise))}
  return out


def _spec(**kw):
  base = dict(name="t", claim="c", criterion="r", analysis="scaling", runs=())
  base.update(kw)
  return ExperimentSpec(**base)


def test_scaling_analysis_judges_by_its_rules(tmp_path):
  # Same exponent, RedLLM 10% lower loss everywhere: compute-efficiency supported, parameter
  # efficiency contradicted (its x are the same here), frontier mostly RedLLM -> contradicted.
  res = _scaling_results(0.1, 0.1, 0.9)
  a = scaling.analyse(_spec(), res, str(tmp_path))
  v = {x.claim.split(" ")[0] + x.claim.split(" ")[-1]: x.verdict for x in a.verdicts}
  assert a.verdicts[0].verdict == "supported"  # Exponents' intervals overlap.
  assert a.verdicts[1].verdict == "contradicted"  # DecLLM is *not* lower at equal params.
  assert a.verdicts[2].verdict == "supported"  # RedLLM lower at equal FLOPs.
  assert a.verdicts[3].verdict == "contradicted", v
  fits = a.numbers["fits"]["flops"]
  assert fits["decllm"]["exponent"] == pytest.approx(0.1, abs=0.01)
  assert sorted(a.plots) == ["scaling_vs_flops.png", "scaling_vs_params.png"]
  assert all((tmp_path / p).read_bytes()[:4] == b"\x89PNG" for p in a.plots)
  # Clearly different exponents: the intervals separate.
  far = scaling.analyse(_spec(), _scaling_results(0.05, 0.3, 1.0), str(tmp_path))
  assert far.verdicts[0].verdict == "contradicted"
  # Too few sizes for a fit: inconclusive, not an exception.
  few = {k: v for k, v in res.items() if k[-1] in "01"}
  assert all(x.verdict == "inconclusive" for x in scaling.analyse(_spec(), few,
                                                                   str(tmp_path)).verdicts[:3])


def test_mixed_attention_analysis_needs_two_seeds_and_beats_the_noise(tmp_path):
  def results(losses):
    out = {}
    for (variant, seed), loss in losses.items():
      out[f"{variant}{seed}"] = {"eval_loss": loss, "tags": {"base": "redllm",
                                                             "variant": variant, "seed": seed}}
    return out
  spec = _spec(analysis="mixed")
  better = results({("none", 0): 5.0, ("none", 1): 5.02, ("per_head", 0): 4.8,
                    ("per_head", 1): 4.81, ("per_layer", 0): 5.3, ("per_layer", 1): 5.31})
  a = mixed.analyse(spec, better, str(tmp_path))
  assert [v.verdict for v in a.verdicts] == ["supported", "contradicted"]
  one_seed = results({("none", 0): 5.0, ("per_head", 0): 4.0, ("per_layer", 0): 6.0})
  assert {v.verdict for v in mixed.analyse(spec, one_seed, str(tmp_path)).verdicts} == {
      "inconclusive"}


def test_specs_reject_duplicate_runs_and_forward_references():
  r = RunSpec(name="a", config="tiny_decllm.py")
  with pytest.raises(ValueError, match="duplicate"):
    _spec(runs=(r, r)).validate()
  with pytest.raises(ValueError, match="earlier run"):
    _spec(runs=(RunSpec(name="b", config="x.py", init_from_run="a"), r)).validate()
  assert r.digest() != RunSpec(name="a", config="tiny_decllm.py", overrides=("x=1",)).digest()


def test_length_analysis_compares_degradation_at_the_longest_length(tmp_path):
  from t5like.experiments import length

  def run(family, seed, losses):
    return {"family": family, "evals": {f"x{k}": {"eval_loss": v}
                                        for k, v in zip((1, 2, 4, 8), losses)}}
  spec = _spec(analysis="length", params=(("factors", (1, 2, 4, 8)), ("sigmas", 2.0)))
  sharp = {"d0": run("decllm", 0, [3.0, 3.1, 4.0, 5.0]), "d1": run("decllm", 1, [3.0, 3.1, 4.1, 5.1]),
           "r0": run("redllm", 0, [3.2, 3.25, 3.3, 3.4]), "r1": run("redllm", 1, [3.2, 3.2, 3.3, 3.5])}
  a = length.analyse(spec, sharp, str(tmp_path))
  assert a.verdicts[0].verdict == "supported"
  assert a.numbers["mean_loss"]["decllm"] == pytest.approx([3.0, 3.1, 4.05, 5.05])
  flipped = {k: run("redllm" if v["family"] == "decllm" else "decllm", 0,
                    [v["evals"][f"x{x}"]["eval_loss"] for x in (1, 2, 4, 8)])
             for k, v in sharp.items()}
  assert length.analyse(spec, flipped, str(tmp_path)).verdicts[0].verdict == "contradicted"
  single = {"d0": sharp["d0"], "r0": sharp["r0"]}
  assert length.analyse(spec, single, str(tmp_path)).verdicts[0].verdict == "inconclusive"
  assert (tmp_path / "length_extrapolation.png").exists()


def test_instruction_tuning_analysis_weighs_loss_and_inference_flops(tmp_path):
  from t5like.experiments import instruct

  def run(variant, seed, loss, flops):
    return {"eval_loss": loss, "inference_flops_per_sequence": flops, "params": 1e6,
            "tags": {"stage": "finetune", "variant": variant, "seed": seed},
            "tasks": {"scores": {"a": {"exact_str_match": 0.5 * seed},
                                 "b": {"multiple_choice_grade": 1.0}, "c": {"error": "x"}}}}
  res = {f"{v}{s}": run(v, s, loss + 0.01 * s, flops)
         for v, loss, flops in (("decllm", 3.0, 4e8), ("decllm_biattn", 2.8, 4e8),
                                ("redllm", 2.99, 1.5e8)) for s in (0, 1)}
  res["pre"] = {"eval_loss": 9.0, "tags": {"stage": "pretrain", "variant": "decllm"}}
  a = instruct.analyse(_spec(analysis="instruct"), res, str(tmp_path))
  assert [v.verdict for v in a.verdicts] == ["supported", "supported"]
  assert a.numbers["task_score"]["redllm"] == pytest.approx((0 + 1 + 0.5 + 1) / 4)  # Errors out.
  worse = dict(res, redllm0=run("redllm", 0, 3.5, 1.5e8), redllm1=run("redllm", 1, 3.51, 1.5e8))
  assert instruct.analyse(_spec(), worse, str(tmp_path)).verdicts[0].verdict == "contradicted"


def test_rank_analysis_compares_bidirectional_with_causal_maps(tmp_path):
  import json

  from t5like.experiments import rank

  def layer(eff, tri):
    return {"stack": "decoder", "layer": 0, "normalized_effective_rank_per_row": eff,
            "normalized_rank_per_row": eff, "triangular_full_rank_fraction": tri,
            "dong_ratio": 0.5}
  arms = {"decllm_causal": ("causal", [0.50, 0.52, 0.51], 1.0),
          "decllm_prefix": ("bidirectional", [0.30, 0.31, 0.29], 0.0),
          "redllm_per_head": ("mixed", [0.5, 0.5, 0.5], 0.75)}
  results = {}
  (tmp_path / "attention").mkdir()
  for name, (kind, eff, tri) in arms.items():  # Cached summaries: no model is loaded.
    results[name] = {"name": name, "digest": name, "tags": {"arm": name, "kind": kind}}
    (tmp_path / "attention" / f"{name}.json").write_text(
        json.dumps({"digest": name, "rows": 3, "layers": [layer(eff, tri)]}))
  spec = _spec(analysis="rank", params=(("rows", 3), ("sigmas", 2.0)))
  verdicts = {v.claim.split(":")[0]: v.verdict for v in rank.analyse(spec, results,
                                                                      str(tmp_path)).verdicts}
  assert verdicts == {"decllm_prefix": "supported", "decllm_causal": "supported",
                      "redllm_per_head": "contradicted"}  # 75% triangular is not "every map".
