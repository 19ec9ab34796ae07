"""The architecture x objective experiment: its grid and equal-compute accounting, its rules on
made-up results, and the runner end to end on a minimal budget (two cells, micro models)."""
from __future__ import annotations

import dataclasses
import importlib.util
import math
import os

import pytest

from t5like.experiments import arch_objective, runner
from t5like.experiments.report import write_report
from t5like.training import flops

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _module():
  path = os.path.join(ROOT, "configs", "experiments", "architecture_objective.py")
  spec = importlib.util.spec_from_file_location("architecture_objective_cfg", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_grid_cells_objectives_and_equal_stack_compute():
  exp = _module()
  spec = exp.get_experiment("quick")
  cells = {(r.tag("arch"), r.tag("objective")) for r in spec.runs}
  assert len(cells) == len(spec.runs) == 9  # 7 cells of Wang et al.'s grid + 2 shared.
  assert ("encoder_decoder", "full_lm") not in cells
  assert ("non_causal_decoder", "full_lm") not in cells
  assert len(exp.get_experiment("full").runs) == 18  # Two seeds.
  i, t = exp.span_lengths()
  assert i + t == exp.ROW
  for run in spec.runs:
    cfg = runner.run_config(run, {})
    assert cfg.model.vocab_size == 8292 and cfg.data.extra_ids == 100
    assert dict(run.evals)["span_corruption"][0] == "data.objective=span_corruption"
    dec, enc = runner.sequence_lengths(cfg)
    if cfg.model.family == "decllm":
      assert dec == exp.ROW and cfg.model.num_layers == 2
      assert cfg.model.decoder_attention == (
          "prefix" if run.tag("arch") == "non_causal_decoder" else "causal")
    else:  # Encoder + decoder tokens = the decoder-only row; 2 + 2 layers (T5's M FLOPs row).
      assert (cfg.model.num_encoder_layers, cfg.model.num_decoder_layers) == (2, 2)
      assert dec + (cfg.data.inputs_length if enc else 0) == exp.ROW
      assert cfg.model.shared_encoder_decoder == run.tag("arch").endswith("shared")
    # The stacks' FLOPs (vocabulary projection aside) equal the 2-layer decoder's on 128 tokens.
    no_logits = dataclasses.replace(cfg.model, vocab_size=1)
    stack = flops.train_flops(no_logits, 8, dec, enc)
    ref = flops.train_flops(dataclasses.replace(no_logits, family="decllm", num_layers=2), 8,
                            exp.ROW, 0)
    assert abs(stack / ref - 1) < 0.35, (run.name, stack / ref)


def _result(arch, objective, seed, prefix, span, score):
  return {"tags": {"arch": arch, "objective": objective, "seed": seed}, "eval_loss": prefix,
          "evals": {"span_corruption": {"eval_loss": span}}, "train_flops": 1e9,
          "tasks": {"scores": {"t": {"multiple_choice_grade": score}}}}


def _results(spans, scores):
  out = {}
  for arch, objective, _, _ in _module().cells():
    key = (arch, objective)
    out[f"{arch}_{objective}"] = _result(arch, objective, 0, 5.0, spans.get(key, 6.0),
                                         scores.get(key, 0.3))
  return out


def test_rules_on_made_up_results(tmp_path):
  spec = _module().get_experiment("quick")
  t5_order = {("encoder_decoder", "span_corruption"): 4.0,
              ("non_causal_decoder", "span_corruption"): 4.1,
              ("causal_decoder", "span_corruption"): 4.3}
  wang = {("causal_decoder", "full_lm"): 0.5}
  a = arch_objective.analyse(spec, _results(t5_order, wang), str(tmp_path))
  assert [v.verdict for v in a.verdicts] == ["supported", "supported"]
  assert (tmp_path / "architecture_objective.png").stat().st_size > 10_000
  reversed_ = {k: 8.3 - v for k, v in t5_order.items()}
  worse = {("causal_decoder", "full_lm"): 0.2}
  a = arch_objective.analyse(spec, _results(reversed_, worse), str(tmp_path))
  assert [v.verdict for v in a.verdicts] == ["contradicted", "contradicted"]
  close = {k: 4.0 + 0.01 * i for i, k in enumerate(t5_order)}
  a = arch_objective.analyse(spec, _results(close, {}), str(tmp_path))
  assert [v.verdict for v in a.verdicts] == ["inconclusive", "inconclusive"]
  # A gap above the margin but inside the 0-shot means' noise decides nothing: with each task
  # score's standard error 0.15 the 0.2 gap is under 2 standard errors of the difference (0.42).
  noisy = _results(t5_order, wang)
  for r in noisy.values():
    r["tasks"]["scores"]["t"]["multiple_choice_grade_stderr"] = 0.15
  a = arch_objective.analyse(spec, noisy, str(tmp_path))
  assert [v.verdict for v in a.verdicts] == ["supported", "inconclusive"]
  assert "± 0.150" in a.verdicts[1].evidence
  cells = arch_objective.grid(_results(t5_order, wang))
  assert cells["encoder_decoder", "span_corruption"]["span_loss"] == 4.0
  assert math.isnan(cells.get(("encoder_decoder", "full_lm"), {}).get("span_loss", math.nan))


MICRO = ("model.d_model=32", "model.num_heads=1", "model.head_dim=32", "model.d_ff=64",
         "train.steps=2", "train.batch_size=2", "train.warmup_steps=1", "checkpoint.every=2",
         "train.log_every=1", "train.eval_batch_size=2")


@pytest.mark.slow  # make test's 15-minute budget on 2 cores (docs/tests.md)
def test_runner_on_a_minimal_budget(tmp_path):
  """One cell (shared encoder-decoder, span corruption), a micro model, 2 steps, scored on both
  held-out sets; the report has the verdicts and the heatmap."""
  spec = _module().get_experiment("quick")
  keep = [r for r in spec.runs if r.tag("objective") == "span_corruption"
          and r.tag("arch") == "encoder_decoder_shared"]
  runs = tuple(dataclasses.replace(r, overrides=r.overrides + MICRO, tasks=()) for r in keep)
  small = dataclasses.replace(spec, runs=runs, eval_batches=1)
  results = runner.run_experiment(small, str(tmp_path))
  assert set(results) == {r.name for r in runs}
  for r in results.values():
    assert r["eval_loss"] > 0 and r["objective"] == "prefix"
    assert r["evals"]["span_corruption"]["eval_loss"] > 0
  analysis = arch_objective.analyse(small, results, str(tmp_path))
  assert analysis.verdicts[0].verdict == "inconclusive"  # The unshared cells did not run.
  paths = write_report(small, results, analysis, str(tmp_path))
  report = open(paths["report"]).read()
  assert "architecture_objective.png" in report and "span-corruption loss" in report
  assert (tmp_path / "architecture_objective.png").exists()
