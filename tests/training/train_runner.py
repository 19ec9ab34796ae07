"""Subprocess entry point for the training tests: ``python train_runner.py '<json spec>'``.

Spec keys: ``config`` (a Config as a dict), ``workdir``, ``data`` ("synthetic" or "pipeline"),
``kill_at_step`` (SIGKILL this process right after that step, once every checkpoint started so
far is committed), ``sleep_per_step`` (seconds; gives a test time to signal a running job),
``distributed`` ({coordinator_address, num_processes, process_id}); ``data`` "global" is
``GlobalSyntheticData`` starting at batch ``data_start`` (the same global batches whatever the
number of processes).
Prints ``RESULT <json>`` with run()'s return value at the end.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time


class GlobalSyntheticData:
  """Synthetic batches defined globally: batch ``i`` is shard 0's batch ``i`` of the whole global
  batch, and each process keeps its own rows of it, so one process and two see the same data.
  Starts at batch ``start`` (a resumed run across a change in the number of processes restarts its
  data stream: the test says where)."""

  def __init__(self, cfg, start: int):
    from t5like.training.data import SyntheticData
    self.inner, self.start = SyntheticData(cfg), start

  def _rows(self, it, batch_size, shard_index, num_shards):
    class Rows:
      def __iter__(self):
        return self

      def __next__(self):
        full = next(it)
        return {k: v[shard_index * batch_size:(shard_index + 1) * batch_size]
                for k, v in full.items()}

      def save(self, directory):
        it.save(directory)

      def restore(self, directory):
        it.restore(directory)
    return Rows()

  def train(self, batch_size, shard_index, num_shards):
    it = self.inner.train(batch_size * num_shards, 0, 1)
    it.index = self.start
    return self._rows(it, batch_size, shard_index, num_shards)

  def eval(self, batch_size, shard_index, num_shards):
    return self._rows(self.inner.eval(batch_size * num_shards, 0, 1), batch_size, shard_index,
                      num_shards)


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
  kind = spec.get("data", "synthetic")
  data = (SyntheticData(cfg) if kind == "synthetic" else
          GlobalSyntheticData(cfg, spec.get("data_start", 0)) if kind == "global" else None)
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
