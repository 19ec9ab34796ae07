"""Comparisons with the `t5` package's span corruption (`make test-t5`, marked `t5check`):
collected only where `t5.data.preprocessors` imports (the `[t5check]` extra plus
`pip install --no-deps t5`); `make test` never imports it."""
import importlib.util
import os

import pytest

collect_ignore_glob = [] if importlib.util.find_spec("t5") else ["test_*.py"]


def pytest_collection_modifyitems(config, items):
  del config
  here = os.path.dirname(__file__)
  for item in items:
    if str(item.fspath).startswith(here):
      item.add_marker(pytest.mark.t5check)
