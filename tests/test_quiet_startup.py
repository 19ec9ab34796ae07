"""A CPU run starts quietly: no error-level log line, no traceback and none of TensorFlow's
start-up chatter on stderr (only the project's own lines).

``train.py --print_config`` is checked here; a whole training run through ``train.py`` (TensorFlow,
the seqio pipeline, compilation, checkpoints, evaluation) is checked by the learning test,
tests/training/test_train_embedded.py, which runs one anyway.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from t5like import runtime

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


@pytest.mark.parametrize("command", ["eval.py", "build_vocab"])
def test_a_start_shows_only_the_projects_lines(tmp_path, command):
  """eval.py and a tool import TensorFlow (through ``runtime.init_tensorflow``); a missing input
  then ends them: stderr is the error block and
  nothing else (TensorFlow's oneDNN / cudart_stub / absl lines are filtered)."""
  env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL",)}
  env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in [env.get("PYTHONPATH")] if p])
  missing = str(tmp_path / "missing")
  if command == "eval.py":
    argv = [os.path.join(ROOT, "eval.py"), "--workdir", missing]
    message = (f"error: no checkpoint found under {missing!r}; expected "
               "<workdir>/checkpoints/<step>/state as written by train.py")
  else:
    argv = ["-m", "t5like.tools.build_vocab", "--input", f"{missing}/*.jsonl", "--output_prefix",
            str(tmp_path / "spm")]
    message = f"error: build_vocab: no file matches --input pattern '{missing}/*.jsonl'"
  proc = subprocess.run([sys.executable] + argv, cwd=tmp_path, env=env, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert proc.stderr.splitlines() == [message, "(the traceback: add --debug or set T5LIKE_DEBUG=1)"]


def test_the_start_up_filter_drops_only_tensorflows_chatter():
  from t5like import runtime
  chatter = [
      "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
      "I0000 00:00:1795797782.235510 6986 port.cc:153] oneDNN custom operations are on. You may "
      "see slightly different numerical results",
      "I0000 00:00:1795797802.556837 7630 cpu_feature_guard.cc:227] This TensorFlow binary is "
      "optimized to use available CPU instructions",
  ]
  cuda = ["I0000 00:00:1795797782.239356 6986 cudart_stub.cc:31] Could not find cuda drivers on "
          "your machine, GPU will not be used.",
          "E0000 00:00:1.0 1 cuda_platform.cc:52] failed call to cuInit: UNKNOWN ERROR (303)"]
  others = ["W0000 00:00:1.0 1 some_op.cc:1] a real warning", "error: the project's own line"]
  assert [l for l in chatter + cuda + others if runtime._shown(l, driver=False)] == others
  assert [l for l in chatter + cuda + others if runtime._shown(l, driver=True)] == cuda + others


@pytest.mark.aot
def test_compile_only_for_a_tpu_topology_prints_no_error_lines(tmp_path):
  """libtpu on a host without TPUs: no ``E0000 ... unexpected worker hostname`` (runtime.py)."""
  env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL",)}
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--compile_only",
                         "--topology", "v5e:2x2"], cwd=tmp_path, env=env, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "4 x TPU v5 lite" in proc.stdout
  assert error_lines(proc.stderr) == []
  assert "could not determine TPU" not in proc.stderr  # libtpu's own warnings, before its errors.


def test_libtpu_init_args_give_its_compiler_fibers_room_and_keep_the_users_choice(monkeypatch):
  """``LIBTPU_INIT_ARGS`` gets the 4 MiB fiber stack (and ``--undefok`` for it) in front of the
  user's flags; a size the user set is left alone."""
  monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_enable_latency_hiding_scheduler=true")
  runtime.libtpu_init_args()
  assert os.environ["LIBTPU_INIT_ARGS"].split() == [
      "--fibers_default_thread_stack_size=4194304", "--undefok=fibers_default_thread_stack_size",
      "--xla_tpu_enable_latency_hiding_scheduler=true"]
  runtime.libtpu_init_args()  # Idempotent.
  assert os.environ["LIBTPU_INIT_ARGS"].count("fibers_default_thread_stack_size=") == 1
  monkeypatch.setenv("LIBTPU_INIT_ARGS", "--fibers_default_thread_stack_size=65536")
  runtime.libtpu_init_args()
  assert os.environ["LIBTPU_INIT_ARGS"] == "--fibers_default_thread_stack_size=65536"
  monkeypatch.delenv("LIBTPU_INIT_ARGS")
  runtime.libtpu_init_args()
  assert os.environ["LIBTPU_INIT_ARGS"].startswith("--fibers_default_thread_stack_size=")


@pytest.mark.aot
def test_the_installed_libtpu_knows_the_fiber_stack_flag():
  """Without ``--undefok`` libtpu refuses a flag it does not know, so this start succeeding says
  the stack size is applied, not silently skipped (a libtpu upgrade that drops it fails here)."""
  env = dict(os.environ, LIBTPU_INIT_ARGS="--fibers_default_thread_stack_size=4194304",
             ALLOW_MULTIPLE_LIBTPU_LOAD="1")
  code = ("from jax.experimental import topologies; "
          "print(len(topologies.get_topology_desc(platform='tpu', topology_name='v5e:2x2')"
          ".devices))")
  proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 0 and proc.stdout.split()[-1] == "4", proc.stderr[-2000:]
  bad = dict(env, LIBTPU_INIT_ARGS="--no_such_libtpu_flag_t5like=1")  # The check can fail.
  proc = subprocess.run([sys.executable, "-c", code], env=bad, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode != 0 and "Unknown command line flag" in proc.stderr
