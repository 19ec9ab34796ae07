"""Process start-up for the CLIs and the data pipeline: TensorFlow (used only for data) off
accelerators, no false CUDA error on hosts without an NVIDIA driver, and libtpu's settings.

TensorFlow probes CUDA the first time it lists devices. On a host with a CUDA toolkit but no
NVIDIA driver (a CPU box, a TPU VM) that probe logs ``E... cuda_platform.cc] failed call to
cuInit`` at error level although nothing is wrong, and importing TensorFlow logs info lines
(``oneDNN custom operations are on``, ``cudart_stub ... Could not find cuda drivers``, absl's
``All log messages before absl::InitializeLog()`` notice), twice (two of its libraries log), which
``TF_CPP_MIN_LOG_LEVEL`` does not silence (they are written before absl's logging is set up).
``init_tensorflow`` imports TensorFlow and runs the probe once with the process's stderr captured
and prints every captured line again except those (the CUDA ones only when no driver exists, so
a real GPU failure is still shown). It then hides GPUs from TensorFlow (as T5X/seqio users do),
leaving them to JAX. The CLIs call it before anything imports TensorFlow.

libtpu, loaded on a host without TPU chips to compile for a TPU topology ahead of time
(``train.py --compile_only --topology``), cannot find the TPU VM's metadata and logs ``E0000 ...
unexpected worker hostname`` at error level although the compile is fine.
``libtpu_env_for_compile_only`` sets, before libtpu starts, the variables it asks for (the
accelerator type of the topology compiled for, this host as its only worker) — only where no TPU
chip is attached and nobody set them already, so a TPU VM's own start-up is untouched.

libtpu's compiler emits kernels on fibers with small stacks, and one of its convolution emitters
recurses deeper than they hold on some paper configs (redllm_4b_flan and redllm_8b_flan for
v5p-128 at ``dots_no_batch``: ``SIGSEGV STACK OVERFLOW`` in
``FusedSpatialMajorConvolution::MakeConvWindows``, on a TPU VM as on a CPU host compiling ahead
of time). ``libtpu_init_args`` gives them 4 MiB (``LIBTPU_INIT_ARGS``) before libtpu loads,
unless the user chose a size; ``--undefok`` keeps a libtpu without that flag starting.
"""
from __future__ import annotations

import contextlib
import glob
import os
import sys
import tempfile
from typing import Callable

# Lines TensorFlow writes on every start: information, not problems (module doc).
_CHATTER = ("oneDNN custom operations are on", "All log messages before absl::InitializeLog()",
            "cpu_feature_guard.cc", "To enable the following instructions:")
# Its CUDA probe's complaints, benign where no NVIDIA driver exists.
_NO_DRIVER = ("failed call to cuInit", "Could not find cuda drivers")
_done = False


GOOGLE_PCI_VENDOR = "0x1ae0"


def has_tpu_chips() -> bool:
  """Whether a Google TPU is attached to this host (a PCI device of Google's vendor id)."""
  for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
    try:
      with open(vendor) as f:
        if f.read().strip() == GOOGLE_PCI_VENDOR:
          return True
    except OSError:
      continue
  return False


def libtpu_env_for_compile_only(accelerator_type: str) -> None:
  """Before libtpu loads on a host without TPUs: the variables it would otherwise log errors
  about (module docstring). ``accelerator_type``: Cloud's name, e.g. v5p-8, v5litepod-4."""
  if has_tpu_chips():
    return
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", accelerator_type)
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("TPU_WORKER_ID", "0")


FIBER_STACK_FLAG = "fibers_default_thread_stack_size"
FIBER_STACK_BYTES = 4 << 20


def libtpu_init_args() -> None:
  """Before libtpu loads: room on its compiler's fiber stacks (module docstring), in front of
  the user's own ``LIBTPU_INIT_ARGS``, which may set the size otherwise."""
  args = os.environ.get("LIBTPU_INIT_ARGS", "")
  if FIBER_STACK_FLAG in args:
    return
  ours = f"--{FIBER_STACK_FLAG}={FIBER_STACK_BYTES} --undefok={FIBER_STACK_FLAG}"
  os.environ["LIBTPU_INIT_ARGS"] = f"{ours} {args}".strip()


def has_nvidia_driver() -> bool:
  return os.path.exists("/proc/driver/nvidia/version") or bool(glob.glob("/dev/nvidia[0-9]*"))


def _shown(line: str, driver: bool) -> bool:
  return not (any(c in line for c in _CHATTER) or (not driver and any(
      c in line for c in _NO_DRIVER)))


@contextlib.contextmanager
def _filtered_stderr(keep: Callable[[str], bool]):
  """Captures file descriptor 2 (C++ logs too) and writes back the lines ``keep`` accepts."""
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile(mode="w+b") as captured:
    os.dup2(captured.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      for line in captured.read().decode(errors="replace").splitlines():
        if keep(line):
          print(line, file=sys.stderr)


def init_tensorflow() -> None:
  """Idempotent: import TensorFlow and probe its devices once without its start-up chatter, then
  keep TensorFlow on the CPU."""
  global _done
  if _done:
    return
  _done = True
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # Drop TF's info chatter, keep warnings.
  driver = has_nvidia_driver()
  with _filtered_stderr(lambda line: _shown(line, driver)):
    import tensorflow as tf
    tf.config.list_physical_devices()
  try:
    tf.config.set_visible_devices([], "GPU")
  except RuntimeError:  # Devices already initialised by someone else: nothing to change.
    pass
