"""Training-test setup: one JAX compilation cache per test session.

XLA:CPU compilation dominates these tests (seconds per step function, tiny models included).
Subprocess runs of the same program (uninterrupted / killed / resumed, 8-device runs) reuse each
other's executables through a persistent cache in a session temporary directory. The cache only
skips recompiling identical programs; it does not change what runs.
"""
from __future__ import annotations

import os

import jax
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture(scope="session", autouse=True)
def _compilation_cache(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("jax_cache"))
  previous = {k: os.environ.get(k) for k in (
      "JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
      "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES")}
  os.environ["JAX_COMPILATION_CACHE_DIR"] = path  # Inherited by the subprocesses.
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
  old_dir = jax.config.jax_compilation_cache_dir
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  _reset_cache()
  yield path
  jax.config.update("jax_compilation_cache_dir", old_dir)
  _reset_cache()
  for k, v in previous.items():
    if v is None:
      os.environ.pop(k, None)
    else:
      os.environ[k] = v


def _reset_cache() -> None:
  """Makes JAX re-read the cache settings if something compiled before this fixture ran."""
  try:
    from jax._src import compilation_cache
    compilation_cache.reset_cache()
  except Exception:  # noqa: BLE001 - private API; without it the cache may just stay off.
    pass
