"""Every suite on both families' tiny checkpoints through ``eval.py --suite``, and a suite that
fails fails the command: exit status 2, one ``error:`` line naming the suite and the checkpoint
(no traceback), and report.md saying what is missing and why. A suite is made to fail on purpose
(monkeypatched in this process) to prove the propagation."""
from __future__ import annotations

import json
import os
import re

import pytest

from cli_scripts import load_script

SUITES = "ppl,tasks,length,cost,attention"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def checkpoints(trained_runs):
  """Both families' tiny checkpoints (step 3), shared with the other evaluation tests."""
  return {family: workdir for family, (workdir, _) in trained_runs.items()}


def _errors(capsys) -> list[str]:
  """The error block at the end of stderr (its lines, without the --debug hint)."""
  err = capsys.readouterr().err
  assert "Traceback" not in err, err[-3000:]
  lines = err.splitlines()
  start = next((i for i, ln in enumerate(lines) if ln.startswith("error:")), len(lines))
  assert lines[-1:] == ["(the traceback: add --debug or set T5LIKE_DEBUG=1)"], err[-3000:]
  return lines[start:-1]


@pytest.mark.slow  # make test's 15-minute budget on 2 cores (docs/tests.md)
def test_every_suite_on_both_families_and_one_failing_fails_eval_py(checkpoints, tmp_path,
                                                                   monkeypatch, capsys):
  from t5like.evaluation import suite
  real_cost = suite._cost

  def cost_fails_for_redllm(model, cfg, lengths):
    if cfg.model.family == "redllm":
      raise RuntimeError("made to fail by the test")
    return real_cost(model, cfg, lengths)
  monkeypatch.setattr(suite, "_cost", cost_fails_for_redllm)
  out = tmp_path / "out"
  eval_cli = load_script("eval.py")
  code = eval_cli.main(["--workdir", checkpoints["decllm"], "--workdir", checkpoints["redllm"],
                        "--suite", SUITES, "--shots", "0", "--max_batches", "1",
                        "--output_dir", str(out)])
  errors = _errors(capsys)
  assert code == 2
  assert errors == [f"error: suite cost failed for {checkpoints['redllm']}: RuntimeError: made "
                    "to fail by the test", f"       (the other results: {out}/report.md)"], errors
  results = json.loads((out / "results.json").read_text())
  for family, path in checkpoints.items():
    c = results["checkpoints"][path]
    failed = {s for s in SUITES.split(",") if "error" in c[s]}
    assert failed == ({"cost"} if family == "redllm" else set()), (family, c)
    assert (out / c["attention"]["heatmaps"]).exists()
  report = (out / "report.md").read_text()
  assert re.search(r"Not shown for redllm \(redllm, step 3\): the cost suite failed "
                   r"\(RuntimeError: made to fail by the test\)", report), report


def test_an_attention_suite_that_writes_no_plot_fails(checkpoints, tmp_path, monkeypatch,
                                                      capsys):
  from t5like.evaluation import attention_analysis
  eval_cli = load_script("eval.py")
  argv = ["--workdir", checkpoints["decllm"], "--suite", "attention", "--output_dir",
          str(tmp_path / "ok")]
  assert eval_cli.main(argv) == 0
  assert "plots: ['attention_decllm.png']" in capsys.readouterr().out
  monkeypatch.setattr(attention_analysis, "plot_heads", lambda *args, **kwargs: None)
  argv[-1] = str(tmp_path / "none")
  assert eval_cli.main(argv) == 2
  errors = _errors(capsys)
  assert errors == [f"error: suite attention failed for {checkpoints['decllm']}: RuntimeError: "
                    "it wrote no plot (attention_decllm.png is missing)",
                    f"       (the other results: {argv[-1]}/report.md)"], errors


def test_a_failing_suite_fails_the_demo(monkeypatch, capsys, tmp_path):
  """``make demo`` ends in the suite report: a suite failing there fails the demo."""
  from t5like import demo
  from t5like.cli import guard
  from t5like.evaluation import suite

  def fails(path, suites, **kwargs):
    return {"checkpoint": path, "step": 2, "family": "redllm", "config_sha256": "0" * 64,
            **{s: {"error": "RuntimeError: made to fail by the test"} for s in suites}}
  monkeypatch.setattr(suite, "evaluate_one", fails)
  code = guard(lambda argv: demo._suite_report(["/runs/red"], str(tmp_path / "report")), [])
  assert code == 2
  errors = _errors(capsys)
  assert errors[0] == ("error: suite ppl failed for /runs/red: RuntimeError: made to fail by "
                       "the test") and len(errors) == 6, errors  # 5 suites, then the report.
  report = (tmp_path / "report" / "report.md").read_text()
  assert "- attention for red (redllm, step 2): RuntimeError: made to fail" in report
