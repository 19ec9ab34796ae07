"""Two processes on localhost (jax.distributed with a local coordinator, gloo collectives, 2 CPU
devices each) train a few steps on a 4-device mesh, each feeding its own data shard: they agree
on the loss and write one checkpoint together."""
from __future__ import annotations

import json
import os
import socket
import subprocess

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
