"""Suite-wide set-up: ``tests/`` on sys.path (the shared ``numerics`` helpers) and fast XLA:CPU
compilation (``fast_compile.py``), before any test module imports JAX."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import fast_compile  # noqa: E402

fast_compile.apply()
