import sys
import os

sys.path.insert(0, os.path.dirname(__file__))

import pytest


def pytest_runtest_setup(item):
  """``backends(...)`` tests check what runs on those platforms only: XLA:CPU's own kernels
  (t5like/kernels/, which the model never calls elsewhere) and the splash kernel (Pallas: a TPU
  kernel, interpret mode on CPU; on a GPU a clear error, tests/gpu). Where JAX's default backend
  is another (``make test-gpu``'s GPU), they are skipped."""
  marker = item.get_closest_marker("backends")
  if marker is not None:
    import jax
    if jax.default_backend() not in marker.args:
      pytest.skip(f"for {'/'.join(marker.args)}; the default backend here is "
                  f"{jax.default_backend()!r}")


@pytest.fixture
def kernels():
  """For tests of the CPU kernels themselves: skipped where the library is not built (whether it
  must be is checked by test_cpu_kernels.py::test_the_kernels_are_built_where_they_can_be)."""
  from t5like.kernels import library
  if not library.built():
    pytest.skip("the CPU kernels are not built here (test_the_kernels_are_built_where_they_can_be)")
