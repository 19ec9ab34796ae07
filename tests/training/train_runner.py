"""Subprocess entry point for the training tests: ``python train_runner.py '<json spec>'``.

Spec keys: ``config`` (a Config as a dict), ``workdir``, ``data`` ("synthetic" or "pipeline"),
``kill_at_step`` (SIGKILL this process right after that step, once every checkpoint started so
far is committed), ``sleep_per_step`` (seconds; gives a test time to signal a running job), ``hold_until`` (a
path: after step 2 the run waits until it exists),
``distributed`` ({coordinator_address, num_processes, process_id}); ``data`` "global" is
``GlobalSyntheticData`` starting at batch ``data_start`` (the same global batches whatever the
number of processes).
Prints ``RESULT <json>`` with run()'s return value at the end. With ``cli`` the run goes through
train.py's ``main`` instead (its output and exit status; the config written to a file beside the
workdir, ``data`` and the hooks as above).
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
  hold_until = spec.get("hold_until")

  def hook(step, ckpt):
    if sleep:
      time.sleep(sleep)
    while hold_until and step >= 2 and not os.path.exists(hold_until):
      time.sleep(0.2)
    if kill_at is not None and step >= kill_at:
      ckpt.wait()  # The checkpoints started so far are on disk; the kill lands after them.
      sys.stdout.flush()
      os.kill(os.getpid(), signal.SIGKILL)

  if spec.get("cli"):
    sys.exit(_through_train_py(cfg, spec["workdir"], data, hook))
  result = run(cfg, spec["workdir"], data=data, step_hook=hook)
  print("RESULT " + json.dumps(result, default=str), flush=True)


def _through_train_py(cfg, workdir: str, data, hook) -> int:
  import functools
  import importlib.util

  import t5like.training
  from t5like.config import to_dict
  config = workdir.rstrip("/") + "_config.py"
  with open(config, "w") as f:
    f.write("import json\nfrom t5like.config import Config, apply_dict\n\n\ndef get_config():\n"
            f"  return apply_dict(Config(), json.loads({json.dumps(json.dumps(to_dict(cfg)))}))\n")
  t5like.training.run = functools.partial(t5like.training.run, data=data, step_hook=hook)
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  spec = importlib.util.spec_from_file_location("train_script", os.path.join(repo, "train.py"))
  train = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(train)
  return train.main(["--config", config, "--workdir", workdir])


if __name__ == "__main__":
  main()
