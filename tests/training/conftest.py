"""Training-test setup. Their subprocess runs of the same program (uninterrupted / killed /
resumed, 8-device runs) reuse each other's executables through the run's compilation cache
(tests/fast_compile.py)."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
