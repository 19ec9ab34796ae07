"""A CPU run starts quietly: no error-level log line and no traceback on stderr."""
from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ERROR_LINE = re.compile(r"^(E\d{4} |F\d{4} |Traceback|ERROR[: ])")  # glog/absl E/F, Python.


def _stderr_errors(args, cwd):
  env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL",)}
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return [line for line in proc.stderr.splitlines() if ERROR_LINE.match(line)]


def test_print_config_and_a_two_step_run_print_no_error_lines(tmp_path):
  assert _stderr_errors(["--print_config"], tmp_path) == []
  run = ["--config", os.path.join(ROOT, "configs", "tiny_decllm.py"), "--workdir",
         str(tmp_path / "run"), "--config.train.steps=2", "--config.train.eval_steps=1",
         "--config.checkpoint.every=2", "--config.train.batch_size=2",
         "--config.model.d_model=32", "--config.model.num_heads=1", "--config.model.d_ff=64",
         "--config.model.num_layers=1"]
  assert _stderr_errors(run, tmp_path) == []


def test_the_probe_filter_keeps_other_lines(capfd):
  from t5like import runtime
  runtime.init_tensorflow()
  runtime.init_tensorflow()  # Idempotent: the probe runs once per process.
  import tensorflow as tf
  assert tf.config.get_visible_devices("GPU") == []  # TF stays off accelerators.
  assert "failed call to cuInit" not in capfd.readouterr().err or runtime.has_nvidia_driver()
