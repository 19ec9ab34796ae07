"""A CPU run starts quietly: no error-level log line and no traceback on stderr.

``train.py --print_config`` is checked here; a whole training run through ``train.py`` (TensorFlow,
the seqio pipeline, compilation, checkpoints, evaluation) is checked by the learning test,
tests/training/test_train_embedded.py, which runs one anyway.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ERROR_LINE = re.compile(r"^(E\d{4} |F\d{4} |Traceback|ERROR[: ])")  # glog/absl E/F, Python.


def error_lines(stderr: str) -> list[str]:
  """The error-level lines of a process's stderr (absl/glog E and F, Python tracebacks)."""
  return [line for line in stderr.splitlines() if ERROR_LINE.match(line)]


def test_print_config_prints_no_error_lines(tmp_path):
  env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL",)}
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--print_config"],
                        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert error_lines(proc.stderr) == []


def test_the_probe_filter_keeps_other_lines(capfd):
  from t5like import runtime
  runtime.init_tensorflow()
  runtime.init_tensorflow()  # Idempotent: the probe runs once per process.
  import tensorflow as tf
  assert tf.config.get_visible_devices("GPU") == []  # TF stays off accelerators.
  assert "failed call to cuInit" not in capfd.readouterr().err or runtime.has_nvidia_driver()
