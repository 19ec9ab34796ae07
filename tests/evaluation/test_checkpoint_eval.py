"""eval.py's core: restore a train.py checkpoint and score held-out data per task."""
import json
import os
import re

import pytest

from cli_scripts import load_script
from t5like.evaluation.checkpoint_eval import evaluate_checkpoint, format_report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def runs(trained_runs):
  return trained_runs  # tests/evaluation/conftest.py: trained once per test run.


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_restored_checkpoint_reproduces_the_trainers_eval(runs, family):
  workdir, trained = runs[family]
  report = evaluate_checkpoint(workdir, max_batches=2, per_task=False)
  assert report["step"] == 3 and report["family"] == family
  (metrics,) = report["results"].values()
  # Same parameters, same held-out batches: the trainer's final eval loss, to float precision.
  assert metrics["eval_loss"] == pytest.approx(trained["eval_loss"], rel=1e-5)
  assert metrics["eval_batches"] == 3  # 2 batches split over 3 parts: at least one each.
  with open(report["file"]) as f:
    assert json.load(f)["results"] == json.loads(json.dumps(report["results"]))


def test_per_task_breakdown_and_table(runs):
  workdir, _ = runs["redllm"]
  report = evaluate_checkpoint(workdir, max_batches=1, write=False)
  assert set(report["results"]) == {"embedded_redpajama", "embedded_redpajama.book",
                                    "embedded_redpajama.c4", "embedded_redpajama.wikipedia"}
  table = format_report(report)
  assert "embedded_redpajama.c4" in table and "ppl" in table


def test_decllm_scored_on_the_same_target_tokens_as_redllm(runs):
  """With data.objective=prefix, a causal DecLLM is scored on exactly RedLLM's target halves."""
  kw = dict(mixtures=["embedded_redpajama.c4"], per_task=False, write=False)
  red = evaluate_checkpoint(runs["redllm"][0], **kw)["results"]["embedded_redpajama.c4"]
  dec = evaluate_checkpoint(runs["decllm"][0], overrides=["data.objective=prefix"],
                            **kw)["results"]["embedded_redpajama.c4"]
  dec_all = evaluate_checkpoint(runs["decllm"][0], **kw)["results"]["embedded_redpajama.c4"]
  assert dec["eval_tokens"] == red["eval_tokens"] > 0
  assert dec_all["eval_tokens"] > 1.5 * dec["eval_tokens"]  # All tokens vs the target halves.


def test_missing_checkpoint_is_a_clear_error(tmp_path, capsys):
  with pytest.raises(FileNotFoundError, match="expected <workdir>/checkpoints/<step>/state"):
    evaluate_checkpoint(str(tmp_path))
  assert load_script("eval.py").main(["--workdir", str(tmp_path / "nope")]) == 2
  # One error block, after the run's own log lines (the compilation cache it set up).
  err = re.sub(r"\A(\d\d:\d\d:\d\d (INFO|WARNING) [^\n]*\n)*", "", capsys.readouterr().err)
  assert err.startswith("error: ") and "checkpoints" in err and "Traceback" not in err
