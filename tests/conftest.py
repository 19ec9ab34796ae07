"""Suite-wide set-up: ``tests/`` on sys.path (the shared ``numerics`` helpers), fast XLA:CPU
compilation (``fast_compile.py``) before any test module imports JAX, and the order in which the
two pytest workers take the tests."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import fast_compile  # noqa: E402

fast_compile.apply()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
  """For ``make test`` (pytest-xdist, ``--dist loadgroup``): the tests of a module that share a
  module-scoped fixture (a training run, a checkpoint) stay on one worker, so the fixture runs
  once, and they come first, so the single tests fill in around them instead of one worker
  running the last big module alone."""
  del config
  grouped = []
  for item in items:
    info = getattr(item, "_fixtureinfo", None)
    scopes = {d.scope for defs in info.name2fixturedefs.values() for d in defs} if info else ()
    if "module" in scopes:
      item.add_marker(pytest.mark.xdist_group(item.module.__name__))
      grouped.append(item)
  first = {id(i) for i in grouped}
  items[:] = grouped + [i for i in items if id(i) not in first]
