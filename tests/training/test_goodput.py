"""Goodput (t5like/training/goodput.py): a run killed after its last checkpoint and resumed twice
accounts for every second of each run (the shares add up to its wall time), counts the steps the
first resume repeats as ``recomputed`` in that run only, and the command reads it all back."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from t5like.training import goodput
from train_helpers import REPO, read_metrics, runner_command, subprocess_env, tiny_config


def _parts(r):
  return r["productive_s"] + sum(r["badput_s"].values())


def test_recorder_charges_every_second_to_one_cause(tmp_path):
  t0 = time.time() - 2.0  # Two seconds of "start-up" before the recorder existed.
  rec = goodput.Recorder(str(tmp_path), write=True, t0=t0)
  with rec.time("restore"):
    with rec.time("data"):  # Nested: charged once, to the outer cause.
      time.sleep(0.05)
  rec.loop_started(0)
  with rec.time("compile"):
    time.sleep(0.05)
  rec.step_done(1)
  m = rec.metrics()
  r = goodput.read_records(str(tmp_path))[0]
  assert r["badput_s"]["data"] == 0 and r["badput_s"]["restore"] >= 0.05
  assert r["badput_s"]["startup"] >= 2.0 and r["badput_s"]["compile"] >= 0.05
  assert _parts(r) == pytest.approx(r["wall_s"], abs=1e-9)
  assert sum(m.values()) == pytest.approx(1.0, abs=1e-9)


def _run(cfg, workdir, **options):
  proc = subprocess.run(runner_command(cfg, workdir, **options), cwd=REPO,
                        env=subprocess_env(), capture_output=True, text=True, timeout=400)
  return proc


@pytest.mark.slow  # Three runs and three CLI calls: ~2-3 min on 2 cores.
def test_killed_and_resumed_run_counts_recomputed_steps_once(tmp_path):
  workdir = str(tmp_path)
  cfg = tiny_config("decllm", steps=8)
  cfg.checkpoint.every = 3
  killed = _run(cfg, workdir, kill_at_step=5)  # Checkpoint 3 is on disk; steps 4-5 are lost.
  assert killed.returncode == -9, killed.stderr[-3000:]
  resumed = _run(cfg, workdir)  # From 3: steps 4-5 again, then 6-8.
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  cfg.train.steps = 10
  more = _run(cfg, workdir)  # From 8 (the end of the last run): nothing repeated.
  assert more.returncode == 0, more.stderr[-3000:]

  out = subprocess.run([sys.executable, "-m", "t5like.tools.goodput", workdir, "--json"],
                       cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-3000:]
  report = json.loads(out.stdout)
  runs = report["runs"]
  assert [(r["start_step"], r["last_step"]) for r in runs] == [(0, 5), (3, 8), (8, 10)]
  first, second, third = runs
  assert first["badput_s"]["recomputed"] == 0 and third["badput_s"]["recomputed"] == 0
  assert second["badput_s"]["recomputed"] > 0  # Steps 4-5, in the run that repeated them.
  assert second["badput_s"]["restore"] > 0
  for r in runs:  # Every second of each run is charged to exactly one cause.
    assert r["productive_s"] > 0 and r["badput_s"]["compile"] > 0
    assert _parts(r) == pytest.approx(r["wall_s"], rel=1e-9)
  total = report["total"]
  assert total["wall_s"] == pytest.approx(sum(r["wall_s"] for r in runs))
  assert total["badput_s"]["recomputed"] == pytest.approx(second["badput_s"]["recomputed"])
  assert sum(report["shares"].values()) == pytest.approx(1.0, abs=1e-9)
  # At each log step, metrics.jsonl (and TensorBoard) carry the shares over the runs so far.
  logged = [r for r in read_metrics(workdir) if "loss" in r]
  assert all("goodput" in r and "badput/recomputed" in r for r in logged)
  assert all(sum(v for k, v in r.items() if k == "goodput" or k.startswith("badput/"))
             == pytest.approx(1.0, abs=1e-6) for r in logged)
  assert 0 < logged[-1]["goodput"] < 1
  # The final summary: the run's result and the human-readable table.
  result = json.loads([ln for ln in more.stdout.splitlines() if ln.startswith("RESULT ")][-1][7:])
  assert result["goodput_total"]["runs"] == 3
  table = subprocess.run([sys.executable, "-m", "t5like.tools.goodput", workdir], cwd=REPO,
                         env=subprocess_env(), capture_output=True, text=True, timeout=120)
  assert "total (3 runs)" in table.stdout and "recomputed" in table.stdout
  missing = subprocess.run([sys.executable, "-m", "t5like.tools.goodput", str(tmp_path / "no")],
                           cwd=REPO, env=subprocess_env(), capture_output=True, text=True,
                           timeout=120)
  assert missing.returncode == 2 and "no goodput records" in missing.stderr
  assert "Traceback" not in missing.stderr
