"""Tiny trained checkpoints of both families, trained once per test run and shared by every
module (and every pytest worker) that evaluates a checkpoint: the pytest workers' common temp
root holds them, the first worker to ask trains them under a file lock, the others wait and
reuse them (pytest-xdist's pattern for session-wide data). Training them once per module cost
about a minute of ``make test`` per module."""
from __future__ import annotations

import fcntl
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# 3 steps with a held-out eval of 2 batches at the end, a checkpoint at the last step only.
SMALL = ["model.d_model=32", "model.num_heads=2", "model.head_dim=16", "model.d_ff=64",
         "model.num_layers=1", "train.steps=3", "train.batch_size=4", "train.eval_steps=2",
         "train.eval_batch_size=4", "train.log_every=1", "train.progress_bar=false",
         "checkpoint.every=0"]


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory) -> dict[str, tuple[str, dict]]:
  """family -> (workdir, what ``t5like.training.run`` returned) for configs/tiny_<family>.py
  with ``SMALL``; never modify these workdirs (copy them first)."""
  base = tmp_path_factory.getbasetemp()
  # Under xdist each worker's base is inside this run's own directory: share that one; a
  # single process keeps its own (the parent would be shared with every later run).
  root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "tiny_trained_runs"
  root.mkdir(exist_ok=True)
  with open(root / "lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    done = root / "results.json"
    if not done.exists():
      from t5like.config import load_config
      from t5like.training import run
      results = {}
      for family in ("decllm", "redllm"):
        cfg = load_config(os.path.join(ROOT, "configs", f"tiny_{family}.py"), SMALL)
        results[family] = run(cfg, str(root / family))
      done.write_text(json.dumps(results))
    results = json.loads(done.read_text())
  return {f: (str(root / f), r) for f, r in results.items()}
