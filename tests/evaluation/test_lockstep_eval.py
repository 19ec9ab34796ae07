"""Held-out evaluation over several processes runs in lock-step: two processes on localhost
(jax.distributed, gloo) whose shards hold 2 and 5 batches both run 5 collective eval steps (the
exhausted one feeds zero-weight rows) and report exactly the sums over all rows; nothing hangs."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "training"))
from train_helpers import subprocess_env  # noqa: E402

SCRIPT = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
pid, address = int(sys.argv[1]), sys.argv[2]
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=address, num_processes=2, process_id=pid)
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from t5like.training.held_out import held_out_metrics
from t5like.training.data import global_batch

mesh = Mesh(np.asarray(jax.devices()), ("data",))
rows = NamedSharding(mesh, P("data"))
ROWS = 2  # Per process; 4 global.

def batch(seed):
  r = np.random.RandomState(seed)
  return {"w": r.randint(0, 2, (ROWS, 3)).astype(np.int32), "x": r.rand(ROWS, 3).astype(np.float32)}

local = [batch(10 * pid + i) for i in range((2, 5)[pid])]  # Shards of different sizes.

@jax.jit
def eval_step(params, b):
  wx = b["w"] * b["x"]
  return {"cross_entropy": jnp.sum(wx), "loss": jnp.sum(wx) * params, "correct": jnp.sum(b["w"]),
          "weight": jnp.sum(b["w"]).astype(jnp.float32)}

out = held_out_metrics(eval_step, 2.0, iter(local), lambda b: global_batch(b, rows, 2 * ROWS), 0)
print("RESULT" + json.dumps(out), flush=True)
"""


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _expected():
  """The same sums over every row of both shards, computed here without JAX."""
  wx = w = 0.0
  for pid, count in ((0, 2), (1, 5)):
    for i in range(count):
      r = np.random.RandomState(10 * pid + i)
      bw, bx = r.randint(0, 2, (2, 3)), r.rand(2, 3).astype(np.float32)
      wx += float(np.sum(bw * bx))
      w += float(np.sum(bw))
  return wx / w


def test_two_processes_with_unequal_shards_evaluate_in_lockstep(tmp_path):
  address = f"127.0.0.1:{_free_port()}"
  env = subprocess_env(devices=1)
  procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, str(pid), address], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for pid in range(2)]
  results = []
  for p in procs:
    try:
      out, err = p.communicate(timeout=240)
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      pytest.fail("held-out evaluation hung across processes")
    assert p.returncode == 0, err[-4000:]
    results.append(json.loads(out.split("RESULT", 1)[1]))
  r0, r1 = results
  assert r0 == r1
  assert r0["eval_batches"] == 5  # The longer shard's count, on both processes.
  assert r0["eval_loss"] == pytest.approx(_expected(), rel=1e-5)
