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


# The longest modules (CPU seconds of a whole `make test` on 2 AMD EPYC cores, 2026-12-02), run
# first: `make test` hands whole modules to its two workers (`--dist loadscope`, kept for the
# module fixtures) in collection order (`--no-loadscope-reorder`), so starting with the longest
# ones lets both workers finish together instead of one waiting for the other's last long module.
# A module missing from the list only runs later.
LONGEST_FIRST = (
    "training/test_train_resume.py",  # 93
    "evaluation/test_checkpoint_eval.py",  # 90, trains the shared tiny runs (evaluation/conftest)
    "training/test_train_embedded.py",  # 46: train.py learns the embedded corpus (DecLLM)
    "data/test_pipeline.py",  # 83
    "models/test_attention_kernels.py",  # 70
    "inference/test_generate.py",  # 69
    "training/test_moe_multidevice.py",  # 62
    "models/test_positions_and_stacks.py",  # 60
    "data/test_denoising.py",  # 59
    "models/test_cudnn_packed.py",  # 56
    "training/test_train_multidevice.py",  # 54
    "models/test_attention_variant.py",  # 51
    "experiments/test_runner.py",  # 52
    "training/test_train_step.py",  # 51
    "training/test_train_multiprocess.py",  # 47
    "inference/test_cached_logits.py",  # 45
    "inference/test_moe_generation.py",  # 37
    "data/test_paper_scale.py",  # 36
    "models/test_moe_capacity.py",  # 36
    "training/test_aot.py",  # 34
    "training/test_moe_train.py",  # 30
    "training/test_startup_race.py",  # 29
    "models/test_shared_redllm.py",  # 29
    "test_quiet_startup.py",  # 26
    "models/test_moe_layer.py",  # 26
)

def pytest_collection_modifyitems(session, config, items):
  del session, config
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

  def key(item):
    path = item.nodeid.split("::")[0]
    path = path[len("tests/"):] if path.startswith("tests/") else path
    return rank.get(path, len(rank))
  items.sort(key=key)  # Stable: the order inside a module and among the rest is kept.
