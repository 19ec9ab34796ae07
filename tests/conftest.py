"""Suite-wide set-up: ``tests/`` on sys.path (the shared ``numerics`` helpers), fast XLA:CPU
compilation and the run's shared compilation cache (``fast_compile.py``), before any test module
imports JAX."""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(__file__))

import fast_compile  # noqa: E402

fast_compile.apply()
_CREATED_CACHE = fast_compile.cache_dir()  # Only the process that created it removes it.


def pytest_sessionfinish(session, exitstatus):
  del session, exitstatus
  if _CREATED_CACHE:
    shutil.rmtree(_CREATED_CACHE, ignore_errors=True)
