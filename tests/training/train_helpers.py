"""Shared pieces of the training tests: tiny configs and subprocess launching.

Multi-device and multi-process checks run in subprocesses (``run_script``) so that the main
pytest process keeps its single CPU device.
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

from fast_compile import FLAGS as FAST_COMPILE_FLAGS
from t5like.config import Config, ModelConfig

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_runner.py")
# The subprocesses' temp dir, removed when this test process exits: a SIGKILLed run never runs
# its own atexit cleanup, which would leave TF autograph's generated modules in the system's.
SUBPROCESS_TMP = tempfile.mkdtemp(prefix="t5like_test_subprocesses_")
atexit.register(shutil.rmtree, SUBPROCESS_TMP, ignore_errors=True)


def tiny_config(family: str = "decllm", *, prefix: bool = False, steps: int = 20,
                batch_size: int = 8, length: int = 32) -> Config:
  """A seconds-scale config for the synthetic data (vocab 128, d_model 32)."""
  cfg = Config()
  cfg.model = ModelConfig(
      family=family, vocab_size=128, d_model=32, num_heads=2, head_dim=16, d_ff=64,
      num_layers=2, num_encoder_layers=1, num_decoder_layers=1,
      decoder_attention="prefix" if prefix else "causal", attn_out_norm=family == "redllm",
      dtype="float32")
  cfg.data.mixture = "embedded_redpajama"
  cfg.data.sequence_length = length
  cfg.data.inputs_length = length // 2
  cfg.data.targets_length = length // 2
  t = cfg.train
  t.steps, t.batch_size, t.warmup_steps = steps, batch_size, 2
  t.log_every, t.eval_every, t.eval_steps = 1, 0, 2
  t.adafactor_min_dim_to_factor = 16  # Exercise the factored second moments.
  t.progress_bar = False
  cfg.checkpoint.every = 5
  cfg.checkpoint.keep = 0
  return cfg.validate()


def subprocess_env(devices: int = 1, *, optimize: bool = False, **extra: str) -> dict[str, str]:
  """The environment of a test subprocess: ``devices`` fake CPU devices; ``optimize`` drops the
  suite's fast-compile flags (tests/fast_compile.py) for runs of many steps."""
  env = dict(os.environ)
  env["JAX_PLATFORMS"] = "cpu"
  drop = ("--xla_force_host_platform_device_count",) + (
      tuple(f.split("=")[0] for f in FAST_COMPILE_FLAGS) if optimize else ())
  flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(drop)]
  if devices > 1:
    flags.append(f"--xla_force_host_platform_device_count={devices}")
  # The rest of XLA_FLAGS as the test process has them (tests/fast_compile.py),
  # so runs compared with each other execute the same code.
  env["XLA_FLAGS"] = " ".join(flags)
  env["PYTHONPATH"] = os.pathsep.join([REPO, os.path.dirname(RUNNER),
                                       os.path.dirname(os.path.dirname(RUNNER)),  # tests/
                                       env.get("PYTHONPATH", "")])
  env["TF_CPP_MIN_LOG_LEVEL"] = "3"
  env["TMPDIR"] = SUBPROCESS_TMP
  env.update(extra)
  return env


def run_script(code: str, *, devices: int = 1, timeout: float = 300,
               check: bool = True) -> subprocess.CompletedProcess:
  """Runs Python ``code`` in a fresh interpreter with ``devices`` fake CPU devices."""
  proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO,
                        env=subprocess_env(devices), capture_output=True, text=True,
                        timeout=timeout)
  if check and proc.returncode != 0:
    raise AssertionError(f"subprocess failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n"
                         f"{proc.stderr[-6000:]}")
  return proc


def run_training(cfg: Config, workdir: str, *, optimize: bool = False, timeout: float = 500,
                 **options) -> dict:
  """Trains ``cfg`` in a train_runner.py subprocess; returns its ``run()`` result."""
  proc = subprocess.run(runner_command(cfg, workdir, **options), cwd=REPO, capture_output=True,
                        text=True, env=subprocess_env(optimize=optimize), timeout=timeout)
  lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
  if proc.returncode != 0 or not lines:
    raise AssertionError(f"training subprocess failed ({proc.returncode}):\n"
                         f"{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
  return json.loads(lines[-1][len("RESULT "):])


def runner_command(cfg: Config, workdir: str, **options) -> list[str]:
  """``python train_runner.py`` training ``cfg`` in ``workdir`` (see train_runner.py)."""
  from t5like.config import to_dict
  spec = {"config": to_dict(cfg), "workdir": workdir, **options}
  return [sys.executable, RUNNER, json.dumps(spec)]


def read_metrics(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


def losses_by_step(workdir: str) -> dict[int, list[float]]:
  """Every logged train loss per step (a resumed run replaces the rows past its checkpoint)."""
  out: dict[int, list[float]] = {}
  for rec in read_metrics(workdir):
    if "loss" in rec:
      out.setdefault(rec["step"], []).append(rec["loss"])
  return out


def load_checkpoint_arrays(workdir: str, step: int) -> dict[str, "np.ndarray"]:
  """Every array of checkpoint ``step`` as numpy, keyed by its tree path (no target needed)."""
  import jax
  import numpy as np
  import orbax.checkpoint as ocp
  path = os.path.join(workdir, "checkpoints", str(step), "state")
  with ocp.PyTreeCheckpointer() as ckptr:
    meta = ckptr.metadata(path)
    tree = meta.item_metadata.tree if hasattr(meta, "item_metadata") else meta.tree
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    state = ckptr.restore(path, args=ocp.args.PyTreeRestore(restore_args=restore_args))
  return {jax.tree_util.keystr(p): np.asarray(x)
          for p, x in jax.tree_util.tree_flatten_with_path(state)[0]}


def checkpoint_steps(workdir: str) -> list[int]:
  root = os.path.join(workdir, "checkpoints")
  return sorted(int(d) for d in os.listdir(root) if d.isdigit()) if os.path.isdir(root) else []
