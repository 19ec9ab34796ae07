"""Process start-up for the CLIs and the data pipeline: TensorFlow (used only for data) stays off
accelerators, and its CUDA probe does not print a false error on hosts without an NVIDIA driver.

TensorFlow probes CUDA the first time it lists devices. On a host with a CUDA toolkit but no
NVIDIA driver (a CPU box, a TPU VM) that probe logs ``E... cuda_platform.cc] failed call to
cuInit`` at error level although nothing is wrong. ``init_tensorflow`` runs the probe once with
the process's stderr captured and prints every captured line again except that one — and only
when no driver exists, so a real GPU failure is still shown. It then hides GPUs from TensorFlow
(as T5X/seqio users do), leaving them to JAX.
"""
from __future__ import annotations

import glob
import os
import sys
import tempfile

_BENIGN = "failed call to cuInit"
_done = False


def has_nvidia_driver() -> bool:
  return os.path.exists("/proc/driver/nvidia/version") or bool(glob.glob("/dev/nvidia[0-9]*"))


def init_tensorflow() -> None:
  """Idempotent: probe TensorFlow's devices once, then keep TensorFlow on the CPU."""
  global _done
  if _done:
    return
  _done = True
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # Drop TF's info chatter, keep warnings.
  import tensorflow as tf
  driver = has_nvidia_driver()
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile(mode="w+b") as captured:
    os.dup2(captured.fileno(), 2)
    try:
      tf.config.list_physical_devices()
    finally:
      os.dup2(saved, 2)
      os.close(saved)
    captured.seek(0)
    for line in captured.read().decode(errors="replace").splitlines():
      if driver or _BENIGN not in line:
        print(line, file=sys.stderr)
  try:
    tf.config.set_visible_devices([], "GPU")
  except RuntimeError:  # Devices already initialised by someone else: nothing to change.
    pass
