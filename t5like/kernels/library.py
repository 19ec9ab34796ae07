"""The CPU kernels' shared library (``few_row.cc``, ``cache_attention.cc``, ``argmax.cc``,
``attention_train.cc``, ``head_norm.cc``): found, loaded and registered with XLA once; whether a
caller may use it.

No library offers these kernels for XLA:CPU, hence C++ (docs/performance.md). The library is an
optional extension built at install time (setup.py: a C++ compiler; x86 with AVX2 + FMA to run
it). Where it is missing, off CPU, under a mesh (an FFI call is not partitioned), or with
``T5LIKE_CPU_KERNELS=0`` when a function is traced, the callers use XLA's own operations.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.util
import os

import jax

ENV_SWITCH = "T5LIKE_CPU_KERNELS"
FEW_ROW_FUSED = "t5like_few_row_fused"
CACHE_ATTENTION = "t5like_cache_attention"
ARGMAX = "t5like_argmax"
ATTENTION_STEP = "t5like_attention_step"
ATTENTION_TRAIN_FWD = "t5like_attention_train_fwd"
ATTENTION_TRAIN_BWD = "t5like_attention_train_bwd"
HEAD_NORM_FWD = "t5like_head_norm_fwd"
HEAD_NORM_BWD = "t5like_head_norm_bwd"


@functools.cache
def _load() -> bool:
  spec = importlib.util.find_spec("t5like.kernels._cpu")
  if spec is None or spec.origin is None:
    return False
  try:
    lib = ctypes.CDLL(spec.origin)
  except OSError:
    return False
  if not lib.t5like_cpu_kernels_supported():  # The CPU lacks AVX2 / FMA.
    return False
  for name, symbol in ((FEW_ROW_FUSED, lib.T5likeFewRowFused),
                       (CACHE_ATTENTION, lib.T5likeCacheAttention),
                       (ARGMAX, lib.T5likeArgmax),
                       (ATTENTION_STEP, lib.T5likeAttentionStep),
                       (ATTENTION_TRAIN_FWD, lib.T5likeAttentionTrainFwd),
                       (ATTENTION_TRAIN_BWD, lib.T5likeAttentionTrainBwd),
                       (HEAD_NORM_FWD, lib.T5likeHeadNormFwd),
                       (HEAD_NORM_BWD, lib.T5likeHeadNormBwd)):
    try:
      jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(symbol), platform="cpu")
    except jax.errors.JaxRuntimeError as e:  # A second copy of t5like (benchmarks/ab_revision).
      if "Duplicate" not in str(e):
        raise
  return True


def built() -> bool:
  """Whether the library is installed and this CPU can run it."""
  return _load()


def switched_on() -> bool:
  """False where ``T5LIKE_CPU_KERNELS=0`` (read when a function is traced)."""
  return os.environ.get(ENV_SWITCH, "1") != "0"


def usable_on_one_device() -> bool:
  """``usable``, or inside a mesh of one CPU device (a train step's): nothing is partitioned
  there. A mesh's own platform decides where it names one, so a compile for a TPU topology on a
  CPU host (``train.py --compile_only --topology``) keeps XLA's operations."""
  mesh = jax.sharding.get_abstract_mesh()
  device = None if mesh.empty else getattr(mesh, "abstract_device", None)
  platform = device.platform if device is not None else jax.default_backend()
  return switched_on() and (mesh.empty or mesh.size == 1) and platform == "cpu" and _load()


def usable() -> bool:
  """Whether the function being traced may call the kernels: switched on, on CPU, not under a
  mesh, the library built."""
  return (switched_on() and jax.sharding.get_abstract_mesh().empty
          and jax.default_backend() == "cpu" and _load())
