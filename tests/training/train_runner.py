"""Subprocess entry point for the training tests: ``python train_runner.py '<json spec>'``.

Spec keys: ``config`` (a Config as a dict), ``workdir``, ``data`` ("synthetic" or "pipeline"),
``kill_at_step`` (SIGKILL this process right after that step, once every checkpoint started so
far is committed), ``sleep_per_step`` (seconds; gives a test time to signal a running job),
``distributed`` ({coordinator_address, num_processes, process_id}).
Prints ``RESULT <json>`` with run()'s return value at the end.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time


def main() -> None:
  spec = json.loads(sys.argv[1])
  from t5like.config import Config, apply_dict
  cfg = apply_dict(Config(), spec["config"])
  dist = spec.get("distributed")
  if dist:
    cfg.distributed.coordinator_address = dist["coordinator_address"]
    cfg.distributed.num_processes = dist["num_processes"]
    cfg.distributed.process_id = dist["process_id"]
  cfg.validate()

  from t5like.training import run
  from t5like.training.data import SyntheticData
  data = SyntheticData(cfg) if spec.get("data", "synthetic") == "synthetic" else None
  kill_at = spec.get("kill_at_step")
  sleep = float(spec.get("sleep_per_step", 0.0))

  def hook(step, ckpt):
    if sleep:
      time.sleep(sleep)
    if kill_at is not None and step >= kill_at:
      ckpt.wait()  # The checkpoints started so far are on disk; the kill lands after them.
      sys.stdout.flush()
      os.kill(os.getpid(), signal.SIGKILL)

  result = run(cfg, spec["workdir"], data=data, step_hook=hook)
  print("RESULT " + json.dumps(result, default=str), flush=True)


if __name__ == "__main__":
  main()
