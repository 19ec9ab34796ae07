"""The experiment runner trains and scores each run once: re-running skips finished runs, and a
changed run is trained again. The --quick CLI path end to end is a slow test."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from t5like.experiments import runner
from t5like.experiments.runner import run_experiment
from t5like.experiments.spec import ExperimentSpec, RunSpec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MICRO = ("model.d_model=32", "model.num_heads=1", "model.head_dim=32", "model.d_ff=64",
         "model.num_layers=1", "train.steps=2", "train.batch_size=2", "train.warmup_steps=1",
         "train.eval_every=0", "train.eval_steps=1", "train.eval_batch_size=2",
         "checkpoint.every=2", "train.log_every=1")


def test_runner_measures_runs_and_skips_finished_ones(tmp_path, monkeypatch):
  run = RunSpec(name="dec", config="tiny_decllm.py", overrides=MICRO,
                eval_overrides=("data.objective=prefix",), tags=(("family", "decllm"),))
  spec = ExperimentSpec(name="t", claim="c", criterion="r", analysis="scaling", runs=(run,),
                        eval_batches=1)
  seen = []
  first = run_experiment(spec, str(tmp_path), on_run=lambda n, what: seen.append(what))
  r = first["dec"]
  assert seen == ["training (1/1)"]
  assert r["family"] == "decllm" and r["steps"] == 2 and r["eval_loss"] > 0
  assert r["objective"] == "prefix" and r["eval_tokens"] > 0
  # 32 x 8192 tied embedding + one layer: FLOPs and parameters come from the run's own config.
  assert r["params"] - r["non_embedding_params"] == 32 * 8192
  assert r["train_flops"] > 0 and r["train_tokens"] == 2 * 2 * 128
  from t5like.config import load_config
  from t5like.evaluation.cost import inference_flops
  cfg = load_config(os.path.join(ROOT, "configs", "tiny_decllm.py"), list(MICRO))
  assert r["inference_flops_per_sequence"] == inference_flops(  # Prefill + KV-cache decode.
      cfg.model, cfg.data.inputs_length, cfg.data.targets_length)["total"]
  stored = json.loads((tmp_path / "runs" / "dec" / "result.json").read_text())
  assert stored["digest"] == run.digest() and stored["config"] == runner.config_digest(cfg)

  # Re-running skips training; an eval added since (a longer length) is scored without retraining.
  longer = dataclasses.replace(run, evals=(("x2", ("data.objective=prefix",
                                                   "data.sequence_length=256",
                                                   "data.inputs_length=128",
                                                   "data.targets_length=128")),),
                               tasks=("shipped",))
  seen.clear()
  again = run_experiment(dataclasses.replace(spec, runs=(longer,)), str(tmp_path),
                         on_run=lambda n, what: seen.append(what))
  assert seen == ["skipped (finished earlier)"]
  assert again["dec"]["eval_loss"] == stored["eval_loss"]
  x2 = again["dec"]["evals"]["x2"]
  assert x2["eval_tokens"] == 2 * stored["eval_tokens"]  # Target halves twice as long.
  assert "x2" in json.loads((tmp_path / "runs" / "dec" / "result.json").read_text())["evals"]
  # Task scores added the same way: every shipped task scored 0-shot by its own metric.
  scores = again["dec"]["tasks"]["scores"]
  assert set(scores) == {"antonyms", "famous_lines", "small_sums"}
  assert 0.0 <= scores["small_sums"]["exact_str_match"] <= 1.0
  assert 0.0 <= scores["antonyms"]["multiple_choice_grade"] <= 1.0

  # A changed run (here: scored on every token) is trained and scored again. Its training would
  # resume at the final step, so the trainer and scorer are replaced by recorders here.
  import t5like.evaluation.checkpoint_eval as checkpoint_eval
  import t5like.training as training
  calls = []
  monkeypatch.setattr(training, "run", lambda cfg, wd: calls.append(("train", wd)) or {})
  fake_report = {"objective": "causal", "results": {"m": {"eval_loss": 1.0}}}
  monkeypatch.setattr(checkpoint_eval, "evaluate_checkpoint",
                      lambda wd, **kw: calls.append(("eval", kw["overrides"])) or fake_report)
  changed = ExperimentSpec(name="t", claim="c", criterion="r", analysis="scaling", eval_batches=1,
                           runs=(RunSpec(name="dec", config="tiny_decllm.py", overrides=MICRO,
                                         tags=(("family", "decllm"),)),))
  redo = run_experiment(changed, str(tmp_path))
  assert calls == [("train", r["workdir"]), ("eval", ())]
  assert redo["dec"]["objective"] == "causal" and redo["dec"]["digest"] != r["digest"]
  # The same spec resolving to another config (a default changed since, here Adafactor's
  # per-layer RMS) trains again too; unchanged, it is skipped.
  calls.clear()
  run_experiment(changed, str(tmp_path))
  assert calls == []
  resolve = runner.run_config
  monkeypatch.setattr(runner, "run_config", lambda run, wd: dataclasses.replace(
      resolve(run, wd), train=dataclasses.replace(resolve(run, wd).train,
                                                  adafactor_per_layer=False)))
  again = run_experiment(changed, str(tmp_path))
  assert calls == [("train", r["workdir"]), ("eval", ())]
  assert again["dec"]["digest"] == redo["dec"]["digest"]
  assert again["dec"]["config"] != redo["dec"]["config"]


@pytest.mark.slow
def test_quick_mixed_attention_experiment_end_to_end(tmp_path):
  out = tmp_path / "mixed"
  cmd = [sys.executable, "-m", "t5like.experiments", "mixed_attention", "--quick",
         "--output_dir", str(out)]
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  res = json.loads((out / "results.json").read_text())
  assert set(res) >= {"experiment", "claim", "criterion", "verdicts", "runs", "analysis", "plots"}
  assert len(res["runs"]) == 6 and res["plots"] == ["mixed_attention.png"]
  assert {v["verdict"] for v in res["verdicts"]} == {"inconclusive"}  # One seed per arm.
  assert (out / "mixed_attention.png").read_bytes()[:4] == b"\x89PNG"
  assert "Criterion (fixed before the runs)" in (out / "report.md").read_text()
  again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert again.stdout.count("skipped (finished earlier)") == 6


def test_configs_are_found_without_a_checkout_around_the_package(tmp_path):
  """As a non-editable install: the package alone in site-packages, no configs/ beside it. The
  runs' configs come from ./configs or $T5LIKE_CONFIGS; with neither, a clear error."""
  import shutil
  site = tmp_path / "site-packages"
  shutil.copytree(os.path.join(ROOT, "t5like"), site / "t5like",
                  ignore=shutil.ignore_patterns("*.so", "__pycache__", "embedded"))
  probe = ("from t5like.experiments import __main__ as m\n"
           "print(m.experiments_dir()); print(','.join(m.available()))\n")
  env = {k: v for k, v in os.environ.items() if k != "T5LIKE_CONFIGS"}
  env["PYTHONPATH"] = str(site)

  def ask(cwd, **extra):
    return subprocess.run([sys.executable, "-c", probe], cwd=cwd, env={**env, **extra},
                          capture_output=True, text=True, timeout=120)

  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  proc = ask(elsewhere)
  assert proc.returncode != 0 and "no configs/ folder with experiments/ found" in proc.stderr
  assert "T5LIKE_CONFIGS" in proc.stderr
  configs = os.path.join(ROOT, "configs")
  proc = ask(elsewhere, T5LIKE_CONFIGS=configs)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.splitlines()[0] == os.path.join(configs, "experiments")
  assert "scaling" in proc.stdout.splitlines()[1].split(",")
  shutil.copytree(configs, elsewhere / "configs")
  proc = ask(elsewhere)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.splitlines()[0] == str(elsewhere / "configs" / "experiments")


def test_a_failing_experiment_fails_the_command_and_the_others_still_run(tmp_path, monkeypatch,
                                                                         capsys):
  from t5like import runtime
  from t5like.experiments import __main__ as m
  ran = []

  def run_one(name, budget, out):
    ran.append(name)
    if name == "attention_rank":
      raise ValueError("made to fail by the test\nsecond line")
  monkeypatch.setattr(m, "run_one", run_one)
  monkeypatch.setattr(runtime, "init_tensorflow", lambda: None)
  monkeypatch.setattr(m, "_compilation_cache", lambda out: None)
  names = ["attention_rank", "scaling", "moe"]
  assert m.main(names + ["--quick", "--output_dir", str(tmp_path)]) == 2
  assert ran == names
  err = capsys.readouterr().err
  assert "Traceback" not in err, err
  assert err.splitlines()[0] == ("error: experiment attention_rank failed: ValueError: made to "
                                 "fail by the test"), err


@pytest.mark.slow  # Every experiment's quick budget, in one command, as the README shows it.
@pytest.mark.timeout(5400)
def test_all_quick_experiments_end_to_end(tmp_path):
  proc = subprocess.run([sys.executable, "-m", "t5like.experiments", "all", "--quick",
                         "--output_dir", str(tmp_path)], cwd=ROOT, capture_output=True,
                        text=True, timeout=5400)
  assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
  from t5like.experiments.__main__ import available
  for name in available():
    assert "Criterion (fixed before the runs)" in (tmp_path / name / "report.md").read_text()
