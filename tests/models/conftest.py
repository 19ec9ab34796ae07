import sys
import os

sys.path.insert(0, os.path.dirname(__file__))

import pytest


def pytest_runtest_setup(item):
  """``backends(...)`` tests check what runs on those platforms only: the splash kernel (Pallas:
  a TPU kernel, interpret mode on CPU; on a GPU a clear error, tests/gpu). Where JAX's default backend
  is another (``make test-gpu``'s GPU), they are skipped."""
  marker = item.get_closest_marker("backends")
  if marker is not None:
    import jax
    if jax.default_backend() not in marker.args:
      pytest.skip(f"for {'/'.join(marker.args)}; the default backend here is "
                  f"{jax.default_backend()!r}")

