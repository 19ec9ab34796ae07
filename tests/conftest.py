"""Suite-wide set-up: ``tests/`` on sys.path (the shared ``numerics`` helpers), fast XLA:CPU
compilation and the run's shared compilation cache (``fast_compile.py``), before any test module
imports JAX."""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(__file__))

import fast_compile  # noqa: E402

fast_compile.apply()
_CREATED_CACHE = fast_compile.cache_dir()  # Only the process that created it removes it.


def pytest_sessionfinish(session, exitstatus):
  del session, exitstatus
  if _CREATED_CACHE:
    shutil.rmtree(_CREATED_CACHE, ignore_errors=True)


# The longest modules (seconds of test time on a 2-core Intel Xeon in a slow stretch, 2026-11-27),
# run first: `make test` hands whole modules to its two workers (`--dist loadscope`, kept for the
# module fixtures) in collection order (`--no-loadscope-reorder`), so starting with the longest
# ones lets both workers finish together instead of one waiting for the other's last long module.
# A module missing from the list only runs later.
LONGEST_FIRST = (
    "data/test_pipeline.py",  # 164
    "evaluation/test_checkpoint_eval.py",  # 153
    "training/test_train_embedded.py",  # 143, one test
    "inference/test_generate.py",  # 128
    "training/test_train_resume.py",  # 125
    "models/test_positions_and_stacks.py",  # 125
    "models/test_fast_paths.py",  # 115
    "training/test_train_multidevice.py",  # 104
    "models/test_attention_kernels.py",  # 96
    "training/test_train_multiprocess.py",  # 73
    "training/test_train_step.py",  # 72
    "data/test_tfds_builder.py",  # 67
    "experiments/test_runner.py",  # 64
    "inference/test_cached_logits.py",  # 59
    "test_quiet_startup.py",  # 59
    "data/test_paper_scale.py",  # 51
    "training/test_aot.py",  # 47
)


def pytest_collection_modifyitems(session, config, items):
  del session, config
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

  def key(item):
    path = item.nodeid.split("::")[0]
    path = path[len("tests/"):] if path.startswith("tests/") else path
    return rank.get(path, len(rank))
  items.sort(key=key)  # Stable: the order inside a module and among the rest is kept.
