"""The MoE experiment: its spec builds for both budgets (a pretraining run and an instruction-
tuning run from it per arm and seed), and its analysis applies the written rule to each stage
(same sign beyond the noise: supported; opposite: contradicted; else inconclusive)."""
from __future__ import annotations

import os

from t5like.experiments import moe
from t5like.experiments.__main__ import load_experiment
from t5like.experiments.runner import run_config


def _results(losses):
  return {f"{st}_{f}_{ffn}_{s}": {"eval_loss": loss,
                                  "tags": {"stage": st, "family": f, "ffn": ffn, "seed": s}}
          for (st, f, ffn, s), loss in losses.items()}


def test_moe_spec_pairs_every_arm_and_finetunes_each_pretraining_run():
  for budget in ("quick", "full"):
    spec = load_experiment("moe", budget)
    by_name = {r.name: r for r in spec.runs}
    for stage in ("pretrain", "finetune"):
      runs = [r for r in spec.runs if r.tag("stage") == stage]
      assert {(r.tag("family"), r.tag("ffn")) for r in runs} == {
          ("decllm", "dense"), ("decllm", "moe"), ("redllm", "dense"), ("redllm", "moe")}
    for r in spec.runs:
      if r.tag("stage") == "pretrain":
        assert r.eval_overrides == ("data.objective=prefix",) and not r.init_from_run
        continue
      parent = by_name[r.init_from_run]  # The same arm and seed, pretrained.
      assert parent.tag("stage") == "pretrain" and [parent.tag(k) for k in (
          "family", "ffn", "seed")] == [r.tag(k) for k in ("family", "ffn", "seed")]
    for r in spec.paper_runs:  # Paper runs are filed by stage as the laptop runs are.
      assert r.tag("stage") == ("finetune" if r.init_from_run else "pretrain")
  spec = load_experiment("moe", "quick")
  # The dense DecLLM arm is trained as in instruction_tuning at the same budget: same schedule,
  # warmup and finetuning loop, same configs.
  it = {r.name: r for r in load_experiment("instruction_tuning", "quick").runs}
  ours = {r.name: r for r in spec.runs}
  for mine, theirs in (("decllm_dense_s0", "pretrain_decllm"),
                       ("finetune_decllm_dense_s0", "finetune_decllm_s0")):
    assert (ours[mine].config, ours[mine].overrides, ours[mine].eval_overrides,
            ours[mine].tasks) == (it[theirs].config, it[theirs].overrides,
                                  it[theirs].eval_overrides, it[theirs].tasks)
  workdirs = {r.name: f"/runs/{r.name}" for r in spec.runs}
  for r in spec.runs:  # Finetuning keeps the pretrained model's MoE layout; FLAN data.
    cfg, parent = run_config(r, workdirs), None
    if r.init_from_run:
      parent = run_config(next(p for p in spec.runs if p.name == r.init_from_run), workdirs)
      assert cfg.model.moe == parent.model.moe and cfg.data.mixture == "embedded_flan"
    assert (cfg.model.moe.num_experts > 0) == (r.tag("ffn") == "moe")


def test_moe_analysis_applies_the_rule_per_stage(tmp_path):
  spec = load_experiment("moe", "full")
  def arms(red_dense, red_moe, ft_red_dense, ft_red_moe):
    out = {}
    for s, eps in enumerate((0.0, 0.01)):
      for st, (rd, rm) in (("pretrain", (red_dense, red_moe)),
                           ("finetune", (ft_red_dense, ft_red_moe))):
        out.update({(st, "decllm", "dense", s): 5.0 + eps, (st, "decllm", "moe", s): 4.9 + eps,
                    (st, "redllm", "dense", s): rd + eps, (st, "redllm", "moe", s): rm + eps})
    return _results(out)
  def verdicts(*losses):
    return [v.verdict for v in moe.analyse(spec, arms(*losses), str(tmp_path)).verdicts]
  assert verdicts(4.8, 4.7, 4.8, 4.7) == ["supported", "supported"]
  assert os.path.exists(tmp_path / "moe.png") and os.path.exists(tmp_path / "moe_finetune.png")
  assert verdicts(4.8, 4.7, 4.8, 5.1) == ["supported", "contradicted"]
  assert verdicts(4.8, 5.1, 4.8, 4.7) == ["contradicted", "supported"]
  assert verdicts(5.0, 4.7, 4.8, 4.7) == ["inconclusive", "supported"]  # Dense: within noise.
  one_seed = _results({(st, f, ffn, 0): loss for st in ("pretrain", "finetune") for (f, ffn), loss
                       in {("decllm", "dense"): 5.0, ("decllm", "moe"): 4.9,
                           ("redllm", "dense"): 4.0, ("redllm", "moe"): 3.9}.items()})
  assert [v.verdict for v in moe.analyse(spec, one_seed, str(tmp_path)).verdicts] == [
      "inconclusive", "inconclusive"]
  pretrain_only = {k: v for k, v in one_seed.items() if v["tags"]["stage"] == "pretrain"}
  finetune = moe.analyse(spec, pretrain_only, str(tmp_path)).verdicts[1]
  assert finetune.verdict == "inconclusive" and "no finished run" in finetune.evidence
