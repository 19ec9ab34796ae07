"""One run per workdir (``t5like/training/workdir_lock.py``), on a local disk and on ``gs://``
(the GCS emulator of test_gcs_emulator.py): a second run refuses with one error naming the owner,
the first finishes, and a dead run's lock expires."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from test_gcs_emulator import BUCKET, gcs  # noqa: F401 - the emulator fixture.
from train_helpers import REPO, runner_command, subprocess_env, tiny_config


def _workdir(kind, tmp_path, request):
  if kind == "local":
    return str(tmp_path / "run")
  request.getfixturevalue("gcs")
  return f"gs://{BUCKET}/lock-{os.getpid()}-{time.time_ns()}"


@pytest.mark.parametrize("kind", ["local", "gs"])
def test_second_holder_refused_then_takes_over_once_the_lease_lapses(kind, tmp_path, request):
  from t5like.training.workdir_lock import WorkdirBusy, WorkdirLock
  workdir = _workdir(kind, tmp_path, request)
  first = WorkdirLock(workdir, lease_s=2.0).acquire()
  with pytest.raises(WorkdirBusy) as e:
    WorkdirLock(workdir, lease_s=2.0).acquire()
  msg = str(e.value)
  assert f"pid {os.getpid()} on host {socket.gethostname()}, since " in msg, msg
  assert "run.lock" in msg and ("gcloud storage rm" if kind == "gs" else "rm ") in msg
  time.sleep(2.5)
  assert first.refresh()  # A live run keeps its lease.
  with pytest.raises(WorkdirBusy):
    WorkdirLock(workdir, lease_s=2.0).acquire()

  first._stop.set()  # The owner "dies" (its pid lives on: only the lease can free the lock).
  first._thread.join()
  time.sleep(2.5)
  second = WorkdirLock(workdir, lease_s=2.0).acquire()
  assert not first.refresh() and first.lost  # The dead owner cannot take it back ...
  first.release()  # ... nor delete the new owner's lock.
  record, _ = second.read()
  assert record["token"] == second.token
  second.release()
  assert second.read()[0] is None
  WorkdirLock(workdir).acquire().release()  # Free again.


def test_a_dead_pid_on_this_host_frees_the_lock_at_once(tmp_path):
  from t5like.training.workdir_lock import WorkdirLock
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  (tmp_path / "run.lock").write_text(json.dumps({
      "host": socket.gethostname(), "pid": int(dead.stdout), "since_s": time.time(),
      "refreshed_s": time.time(), "lease_s": 1e6}))
  WorkdirLock(str(tmp_path)).acquire().release()


@pytest.mark.parametrize("kind", ["local", pytest.param("gs", marks=pytest.mark.slow)])
def test_a_second_train_py_in_a_busy_workdir_refuses_and_the_first_finishes(kind, tmp_path,
                                                                            request):
  workdir = _workdir(kind, tmp_path, request)
  env = subprocess_env(**(request.getfixturevalue("gcs") if kind == "gs" else {}))
  cfg = tiny_config("decllm", steps=8)
  go_on = tmp_path / "go_on"  # The first run waits after step 2 until the second one is done.
  first = subprocess.Popen(runner_command(cfg, workdir, hold_until=str(go_on)), cwd=REPO,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    from etils import epath
    lock = epath.Path(workdir) / "run.lock"
    deadline = time.time() + 600
    while not (lock.exists() and (epath.Path(workdir) / "train.log").exists()):
      assert first.poll() is None, first.communicate()[1][-3000:]
      assert time.time() < deadline, "the first run never took its lock"
      time.sleep(0.3)
    second = subprocess.run(
        [sys.executable, os.path.join(REPO, "train.py"), "--workdir", workdir,
         "--config.train.steps=8"], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=900)
    assert second.returncode == 2, second.stderr[-3000:]
    errors = [ln for ln in second.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in second.stderr, second.stderr[-3000:]
    assert (f"error: the workdir {workdir} is in use by another run: pid {first.pid} on host "
            f"{socket.gethostname()}, since ") in errors[0], errors
    go_on.write_text("")
    out, err = first.communicate(timeout=600)
    assert first.returncode == 0, err[-3000:]
    result = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT "))[7:])
    assert result["step"] == 8
    assert not lock.exists()  # Released at the end.
    assert "in use by another run" not in (epath.Path(workdir) / "train.log").read_text()
  finally:
    if first.poll() is None:
      first.kill()
