"""The persistent compilation cache of train.py (``t5like/training/compile_cache.py``) and the
start-up timeline (``t5like/training/startup.py``).

Each cache check starts fresh processes, as a restart does: the first compiles and writes the
cache, the second loads its steps from it (JAX's cache-hit events), a changed config misses. The
suite's own shared cache (tests/fast_compile.py) is taken out of those processes' environment, so
the default location, ``<workdir>/compile_cache``, is what they use.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from t5like.training import compile_cache, startup
from t5like.training.loop import run
from test_gcs_emulator import BUCKET, gcs  # noqa: F401 - gcs: the emulator fixture.
from train_helpers import REPO, subprocess_env, tiny_config

TINY = os.path.join(REPO, "configs", "tiny_decllm.py")
SMALL = ["--config.model.d_model=32", "--config.model.num_heads=2", "--config.model.d_ff=64",
         "--config.model.num_layers=1", "--config.data.sequence_length=32",
         "--config.train.batch_size=4", "--config.train.compile_cache_min_compile_s=0"]


def _compile_only(workdir: str, *extra: str, env: dict[str, str] | None = None) -> str:
  """``train.py --compile_only`` in a fresh process; its first report line (with the cache's)."""
  env = env or {k: v for k, v in subprocess_env().items()
                if not k.startswith("JAX_COMPILATION_CACHE") and "PERSISTENT_CACHE" not in k}
  proc = subprocess.run([sys.executable, os.path.join(REPO, "train.py"), "--config", TINY,
                         "--compile_only", "--workdir", workdir, *SMALL, *extra],
                        cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout.splitlines()[0]


@pytest.mark.slow  # make test's 15-minute budget on 2 cores (docs/tests.md)
def test_a_fresh_process_loads_the_compiled_steps_and_a_changed_config_misses(tmp_path):
  first = _compile_only(str(tmp_path))
  assert "compilation cache miss" in first and "written to it" in first, first
  assert os.listdir(tmp_path / "compile_cache")  # The default place: the workdir's storage.
  second = _compile_only(str(tmp_path))
  assert "compilation cache hit" in second, second
  changed = _compile_only(str(tmp_path), "--config.model.d_ff=96")
  assert "compilation cache miss" in changed, changed


@pytest.mark.slow  # The GCS emulator, and two processes that read and write it.
def test_a_cache_on_a_gs_uri_is_hit_by_a_fresh_process(gcs, tmp_path):
  from etils import epath
  uri = f"gs://{BUCKET}/compile_cache"
  env = {k: v for k, v in subprocess_env(**gcs).items()
         if not k.startswith("JAX_COMPILATION_CACHE") and "PERSISTENT_CACHE" not in k}
  first = _compile_only(str(tmp_path), f"--config.train.compile_cache_dir={uri}", env=env)
  assert "compilation cache miss" in first and "written to it" in first, first
  assert any(p.name.endswith("-cache") for p in epath.Path(uri).iterdir())
  second = _compile_only(str(tmp_path), f"--config.train.compile_cache_dir={uri}", env=env)
  assert "compilation cache hit" in second, second
  assert not (tmp_path / "compile_cache").exists()


def test_turned_off_it_is_neither_read_nor_written(tmp_path):
  line = _compile_only(str(tmp_path), "--config.train.compile_cache=false")
  assert "compilation cache off" in line
  assert not (tmp_path / "compile_cache").exists()


def test_the_config_then_a_given_cache_then_the_workdir_decide_where():
  import jax
  train = tiny_config().train
  train.compile_cache_dir = "gs://bucket/cache"
  assert compile_cache.resolve_dir(train, "/w") == "gs://bucket/cache"
  train.compile_cache_dir = ""
  given = jax.config.jax_compilation_cache_dir  # The suite's own (tests/fast_compile.py), if on.
  assert compile_cache.resolve_dir(train, "/w") == (given or os.path.join("/w", "compile_cache"))
  train.compile_cache = False
  assert compile_cache.resolve_dir(train, "/w") is None


@pytest.mark.slow  # make test's 15-minute budget on 2 cores (docs/tests.md)
def test_start_up_milestones_are_logged_in_order_and_a_restart_restores(tmp_path):
  cfg = tiny_config(steps=1)  # The seqio pipeline of the embedded data: the run compiles ahead.
  cfg.model.vocab_size = 8192  # The embedded vocabulary.
  cfg.checkpoint.every = 0
  run(cfg, str(tmp_path))
  cfg.train.steps = 2
  run(cfg, str(tmp_path))
  marks = [name for name, _ in startup.parse((tmp_path / "train.log").read_text())]
  assert marks == ["imports", "data pipeline ready", "state built", "compiled", "first step",
                   "imports", "data pipeline ready", "state restored", "compiled", "first step"]
  seconds = [s for _, s in startup.parse((tmp_path / "train.log").read_text())]
  assert seconds[:5] == sorted(seconds[:5]) and seconds[5:] == sorted(seconds[5:])


@pytest.mark.slow  # Two eval.py processes.
def test_eval_py_uses_the_evaluated_runs_cache(tmp_path):
  cfg = tiny_config(steps=1)
  cfg.model.vocab_size = 8192  # The embedded vocabulary.
  cfg.train.compile_cache_min_compile_s = 0.0  # Saved with the checkpoint: eval.py reads it.
  run(cfg, str(tmp_path / "run"))
  env = {k: v for k, v in subprocess_env().items()
         if not k.startswith("JAX_COMPILATION_CACHE") and "PERSISTENT_CACHE" not in k}
  cache = tmp_path / "run" / "compile_cache"
  for _ in range(2):
    proc = subprocess.run([sys.executable, os.path.join(REPO, "eval.py"), "--workdir",
                           str(tmp_path / "run"), "--max_batches", "1", "--no_per_task"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = sorted(os.listdir(cache))
    if _ == 0:
      first = written
  assert any(name.startswith("jit_eval") for name in first)
  assert written == first  # The second process loaded every program: nothing new was written.
