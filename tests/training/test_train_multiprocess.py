"""Two processes on localhost (jax.distributed with a local coordinator, gloo collectives, 2 CPU
devices each) train a few steps on a 4-device mesh, each feeding its own data shard: they agree
on the loss and write one checkpoint together."""
from __future__ import annotations

import json
import os
import socket
import subprocess

import pytest

from train_helpers import (REPO, checkpoint_steps, read_metrics, runner_command, subprocess_env,
                           tiny_config)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_two_processes_agree_on_the_loss(tmp_path):
  cfg = tiny_config("redllm", steps=3)
  cfg.checkpoint.every = 0  # Only the final checkpoint.
  address = f"127.0.0.1:{_free_port()}"
  procs = []
  for pid in range(2):
    cmd = runner_command(cfg, str(tmp_path), distributed={
        "coordinator_address": address, "num_processes": 2, "process_id": pid})
    procs.append(subprocess.Popen(cmd, cwd=REPO, env=subprocess_env(devices=2),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  results = []
  for p in procs:
    try:
      out, err = p.communicate(timeout=400)
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      raise
    assert p.returncode == 0, err[-5000:]
    line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1]
    results.append(json.loads(line[len("RESULT "):]))
  r0, r1 = results
  assert r0["step"] == r1["step"] == 3
  assert r0["loss"] == r1["loss"] and r0["eval_loss"] == r1["eval_loss"]
  assert r0["grad_norm"] == r1["grad_norm"]
  assert 0 < r0["loss"] < 10
  # Process 0 alone writes metrics; one checkpoint holds both hosts' data-iterator states.
  assert [r["step"] for r in read_metrics(str(tmp_path)) if "loss" in r] == [1, 2, 3]
  assert checkpoint_steps(str(tmp_path)) == [3]
  data_dir = tmp_path / "checkpoints" / "3" / "data"
  assert {"process_0", "process_1"} <= set(os.listdir(data_dir))


@pytest.mark.slow  # ~45 s; the single-process SIGTERM test is in the default suite.
def test_sigterm_on_one_host_saves_the_same_step_on_both(tmp_path):
  """JAX's preemption sync point: a SIGTERM to process 1 only makes both processes save one
  agreed step and exit cleanly."""
  import signal
  import time
  cfg = tiny_config("decllm", steps=200)
  cfg.checkpoint.every = 0
  address = f"127.0.0.1:{_free_port()}"
  procs = [subprocess.Popen(
      runner_command(cfg, str(tmp_path), sleep_per_step=0.3, distributed={
          "coordinator_address": address, "num_processes": 2, "process_id": pid}),
      cwd=REPO, env=subprocess_env(devices=2), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True) for pid in range(2)]
  try:
    deadline = time.time() + 300
    while time.time() < deadline and all(p.poll() is None for p in procs):
      if (tmp_path / "metrics.jsonl").exists() and len(read_metrics(str(tmp_path))) >= 2:
        break
      time.sleep(0.2)
    assert all(p.poll() is None for p in procs), procs[0].communicate()[1][-3000:]
    procs[1].send_signal(signal.SIGTERM)
    outs = [p.communicate(timeout=300) for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  results = []
  for p, (out, err) in zip(procs, outs):
    assert p.returncode == 0, err[-4000:]
    results.append(json.loads([ln for ln in out.splitlines()
                               if ln.startswith("RESULT ")][-1][len("RESULT "):]))
  assert results[0]["preempted"] and results[1]["preempted"]
  assert results[0]["step"] == results[1]["step"] < 200
  assert checkpoint_steps(str(tmp_path)) == [results[0]["step"]]


def _run_processes(cfg, workdir, n: int, devices: int) -> list[tuple[dict, str]]:
  address = f"127.0.0.1:{_free_port()}"
  procs = [subprocess.Popen(
      runner_command(cfg, workdir, data="pipeline", distributed={
          "coordinator_address": address, "num_processes": n, "process_id": pid}
          if n > 1 else None),
      cwd=REPO, env=subprocess_env(devices=devices), stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True) for pid in range(n)]
  outs = []
  try:
    for p in procs:
      out, err = p.communicate(timeout=400)
      assert p.returncode == 0, err[-5000:]
      line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1]
      outs.append((json.loads(line[len("RESULT "):]), err))
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  return outs


@pytest.mark.slow  # ~1.5 minutes: one single-process run, then two processes resume it.
def test_more_hosts_than_saved_data_states_restart_every_stream_together(tmp_path):
  """A checkpoint written by 1 process (2 devices) is resumed by 2 processes (1 device each):
  process 0 finds a data state for another shard count, process 1 none at all. Both agree to
  restart their data streams (none raises alone, none waits alone) and train on together."""
  cfg = tiny_config("decllm", steps=2)
  cfg.model.vocab_size = 8192  # The embedded corpus and its vocabulary.
  cfg.checkpoint.every = 0
  ((first, _),) = _run_processes(cfg, str(tmp_path), n=1, devices=2)
  assert first["step"] == 2
  data = tmp_path / "checkpoints" / "2" / "data"
  assert [d for d in os.listdir(data) if d.startswith("process_")] == ["process_0"]

  cfg.train.steps = 4
  (r0, err0), (r1, err1) = _run_processes(cfg, str(tmp_path), n=2, devices=1)
  for err in (err0, err1):
    assert "every host restarts its data stream" in err, err[-3000:]
  assert "data_iterator-00000-of-00001.json" in err0  # Shard layout changed on process 0.
  assert "process_1 is missing" in err1
  assert r0["step"] == r1["step"] == 4 and r0["loss"] == r1["loss"]
  assert checkpoint_steps(str(tmp_path)) == [2, 4]
  assert {"process_0", "process_1"} <= set(os.listdir(tmp_path / "checkpoints" / "4" / "data"))
