import sys
import os

sys.path.insert(0, os.path.dirname(__file__))

import pytest


@pytest.fixture
def kernels():
  """For tests of the CPU kernels themselves: skipped where the library is not built (whether it
  must be is checked by test_cpu_kernels.py::test_the_kernels_are_built_where_they_can_be)."""
  from t5like.kernels import library
  if not library.built():
    pytest.skip("the CPU kernels are not built here (test_the_kernels_are_built_where_they_can_be)")
