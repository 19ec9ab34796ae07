"""Exact resume, fallback from a truncated checkpoint, and SIGTERM — all with real subprocesses.

The reference is one uninterrupted run of N steps. Every other run uses the same config, so the
per-step losses and the final checkpoint must match it bit for bit (CPU, same executable).
The SIGKILL test runs on synthetic data and, with ``-m slow``, on the embedded corpus through the
real seqio/tf.data pipeline, where the restored data position is the tf.data iterator checkpoint
(that restore is also checked in-process by tests/data/test_pipeline.py); the others use
synthetic data.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

from train_helpers import (REPO, checkpoint_steps, load_checkpoint_arrays, losses_by_step,
                           read_metrics, runner_command, subprocess_env, tiny_config)

STEPS = 12


def _cfg(data="synthetic"):
  cfg = tiny_config("decllm", steps=STEPS)
  cfg.checkpoint.every = 4
  cfg.model.dropout_rate = 0.1  # Dropout keys must also be reproduced after a restart.
  if data == "pipeline":  # The embedded corpus and its 8k vocabulary.
    cfg.model.vocab_size = 8192
  return cfg


def _run(workdir, *, check=True, timeout=900, data="synthetic", **options):
  proc = subprocess.run(runner_command(_cfg(data), str(workdir), data=data, **options),
                        cwd=REPO, env=subprocess_env(), capture_output=True, text=True,
                        timeout=timeout)
  if check and proc.returncode != 0:
    # Orbax's unraisable-coroutine reports at interpreter exit can fill the stderr tail; show
    # what was printed before them (the run's own error).
    err = proc.stderr.split("Exception ignored in", 1)[0]
    raise AssertionError(f"run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                         f"{err[-5000:]}")
  return proc


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("reference")
  _run(workdir)
  return workdir


@pytest.fixture(scope="module")
def pipeline_reference(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("pipeline_reference")
  _run(workdir, data="pipeline")
  return workdir


def _assert_same_final_state(a, b):
  sa, sb = load_checkpoint_arrays(str(a), STEPS), load_checkpoint_arrays(str(b), STEPS)
  assert sa.keys() == sb.keys()
  for k in sa:
    np.testing.assert_array_equal(sa[k], sb[k], err_msg=k)


@pytest.mark.parametrize("data", ["synthetic", pytest.param("pipeline", marks=pytest.mark.slow)])
def test_sigkill_and_restart_reproduce_the_uninterrupted_run(data, request, tmp_path):
  reference = request.getfixturevalue("reference" if data == "synthetic" else "pipeline_reference")
  ref = losses_by_step(str(reference))
  assert sorted(ref) == list(range(1, STEPS + 1))
  assert all(len(v) == 1 for v in ref.values())
  assert len({v[0] for v in ref.values()}) == STEPS  # Every batch differs.

  killed = _run(tmp_path, check=False, kill_at_step=6, data=data)
  assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
  assert checkpoint_steps(str(tmp_path)) == [4]  # Killed after step 6: only step 4 is saved.
  if data == "pipeline":
    data_state = tmp_path / "checkpoints" / "4" / "data" / "process_0"
    assert any(f.startswith("data_iterator-") for f in os.listdir(data_state))  # tf.data state.
  resumed = _run(tmp_path, data=data)
  assert '"resumed_from_step": 4' in resumed.stdout

  got = losses_by_step(str(tmp_path))
  # Step 5 ran twice (before the kill and after the restart; step 6's metrics are fetched after
  # step 7 is dispatched, so the killed run logged up to step 5): the resumed run's row replaced
  # the killed one's.
  assert got == ref, got
  _assert_same_final_state(reference, tmp_path)


def test_truncated_latest_checkpoint_falls_back_to_the_previous(reference, tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(reference, workdir)
  state_dir = workdir / "checkpoints" / str(STEPS) / "state"
  files = [os.path.join(r, f) for r, _, fs in os.walk(state_dir) for f in fs
           if os.sep + "d" + os.sep in os.path.join(r, f)]
  biggest = max(files, key=os.path.getsize)
  with open(biggest, "r+b") as f:
    f.truncate(os.path.getsize(biggest) // 2)
  # Ask for the same number of steps: the run must redo steps 9..12 from checkpoint 8.
  proc = _run(workdir)
  log = proc.stdout + proc.stderr
  assert f"checkpoints/{STEPS} cannot be restored" in log
  assert "resuming from the previous good checkpoint (step 8)" in log
  assert '"resumed_from_step": 8' in proc.stdout
  assert os.listdir(workdir / "corrupt_checkpoints")
  with open(workdir / "train.log") as f:
    assert "cannot be restored" in f.read()
  _assert_same_final_state(reference, workdir)
  assert losses_by_step(str(workdir)) == losses_by_step(str(reference))  # Redone steps: once.


def test_sigterm_saves_and_exits_cleanly(reference, tmp_path):
  cmd = runner_command(_cfg(), str(tmp_path), sleep_per_step=0.5)
  proc = subprocess.Popen(cmd, cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  metrics = tmp_path / "metrics.jsonl"
  deadline = time.time() + 240
  while time.time() < deadline and proc.poll() is None:
    if metrics.exists() and len(read_metrics(str(tmp_path))) >= 2:
      break
    time.sleep(0.2)
  assert proc.poll() is None, proc.communicate()[1][-3000:]
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=240)
  assert proc.returncode == 0, err[-3000:]
  assert '"preempted": true' in out
  steps = checkpoint_steps(str(tmp_path))
  last = max(r["step"] for r in read_metrics(str(tmp_path)))
  assert 2 <= last < STEPS and steps and steps[-1] == last
  # The preemption checkpoint is a normal one: restarting finishes the run identically.
  _run(tmp_path)
  _assert_same_final_state(reference, tmp_path)


def _tensorboard_points(workdir, tag: str) -> list[int]:
  """The steps of ``tag`` as TensorBoard shows them: event files read in name order, and a
  ``SessionLog.START`` at step s discarding the points from s on (TensorBoard's restart
  handling, ``purge_orphaned_data``)."""
  import tensorflow as tf
  steps: list[int] = []
  for f in sorted(os.listdir(workdir / "tensorboard")):
    for e in tf.compat.v1.train.summary_iterator(str(workdir / "tensorboard" / f)):
      if e.HasField("session_log") and e.session_log.status == e.session_log.START:
        steps = [s for s in steps if s < e.step]
      steps += [e.step for v in e.summary.value if v.tag == tag]
  return steps


def test_ctrl_c_saves_the_step_says_so_in_one_line_and_the_rerun_resumes(reference, tmp_path):
  """train.py under SIGINT: the current step is saved, one line says so, the exit status is 130;
  the same command resumes from that step and finishes like the uninterrupted run, each step
  once in metrics.jsonl and in TensorBoard."""
  workdir = tmp_path / "run"
  proc = subprocess.Popen(runner_command(_cfg(), str(workdir), sleep_per_step=0.5, cli=True),
                          cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 600
  while time.time() < deadline and proc.poll() is None:
    if (workdir / "metrics.jsonl").exists() and len(read_metrics(str(workdir))) >= 2:
      break
    time.sleep(0.2)
  assert proc.poll() is None, proc.communicate()[1][-3000:]
  proc.send_signal(signal.SIGINT)
  out, err = proc.communicate(timeout=600)
  assert proc.returncode == 130, err[-3000:]
  assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
  saved = checkpoint_steps(str(workdir))
  assert saved and saved[-1] < STEPS, saved
  lines = [ln for ln in (out + err).splitlines() if "Ctrl-C" in ln]
  assert lines == [f"Ctrl-C at step {saved[-1]}: checkpoint {saved[-1]} saved in "
                   f"{workdir}/checkpoints; the same command resumes from it"], out + err
  assert '"step"' not in out  # No summary: the run did not finish.

  rerun = subprocess.run(runner_command(_cfg(), str(workdir), cli=True), cwd=REPO,
                         env=subprocess_env(), capture_output=True, text=True, timeout=900)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert f'"step": {STEPS}' in rerun.stdout
  assert f"resumed from checkpoint {workdir}/checkpoints/{saved[-1]}" in (
      workdir / "train.log").read_text()
  assert losses_by_step(str(workdir)) == losses_by_step(str(reference))
  _assert_same_final_state(reference, workdir)
  assert _tensorboard_points(workdir, "loss") == list(range(1, STEPS + 1))
