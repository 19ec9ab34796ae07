"""The repository's command-line scripts (``train.py``, ``eval.py``) loaded as modules, so a test
calls their ``main()`` / ``parse_args()`` in-process (a subprocess spends seconds on imports)."""
from __future__ import annotations

import importlib.util
import os
import types

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script(name: str) -> types.ModuleType:
  """``train.py`` or ``eval.py`` at the repository root, imported under ``<stem>_cli``."""
  stem = os.path.splitext(name)[0]
  spec = importlib.util.spec_from_file_location(f"{stem}_cli", os.path.join(REPO, name))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
