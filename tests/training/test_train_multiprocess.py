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
