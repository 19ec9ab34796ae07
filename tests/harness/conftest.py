"""Tests of the lm-evaluation-harness model (`make test-harness`, marked `harness`): collected
only where lm-eval is installed (the `[harness]` extra); `make test` never imports them."""
import importlib.util
import os

import pytest

collect_ignore_glob = [] if importlib.util.find_spec("lm_eval") else ["test_*.py"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # No network: everything is local.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def pytest_collection_modifyitems(config, items):
  del config
  here = os.path.dirname(__file__)
  for item in items:
    if str(item.fspath).startswith(here):
      item.add_marker(pytest.mark.harness)
