"""Tests of exported models in PyTorch (`make test-hf`, marked `hf`): collected only where torch,
transformers and lm-eval are installed (the `[hf]` extra); `make test` never imports them."""
import importlib.util
import os

import pytest

collect_ignore_glob = [] if all(importlib.util.find_spec(m) for m in (
    "torch", "transformers")) else ["test_*.py"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # No network: everything is local.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config, items):
  del config
  here = os.path.dirname(__file__)
  for item in items:
    if str(item.fspath).startswith(here):
      item.add_marker(pytest.mark.hf)
