"""The CPU kernels' shared library (``cache_attention.cc``, ``argmax.cc``,
``attention_train.cc``, ``head_norm.cc``): found, loaded and registered with XLA once; whether a
caller may use it.

No library offers these kernels for XLA:CPU, hence C++ (docs/performance.md). The library is an
optional extension built at install time (setup.py: a C++ compiler; x86 with AVX2 + FMA to run
it). Only the ``cpu_kernels`` backend calls it (``t5like/ops/cpu_kernels.py``, chosen by
``t5like.ops``); where it is missing, off CPU or under a mesh of several devices (an FFI call
is not partitioned) that backend uses XLA's own operations.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.util

import jax

CACHE_ATTENTION = "t5like_cache_attention"
ARGMAX = "t5like_argmax"
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
  for name, symbol in ((CACHE_ATTENTION, lib.T5likeCacheAttention),
                       (ARGMAX, lib.T5likeArgmax),
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


def usable_on_one_device() -> bool:
  """``usable``, or inside a mesh of one CPU device (a train step's): nothing is partitioned
  there. A mesh's own platform decides where it names one, so a compile for a TPU topology on a
  CPU host (``train.py --compile_only --topology``) keeps XLA's operations."""
  mesh = jax.sharding.get_abstract_mesh()
  device = None if mesh.empty else getattr(mesh, "abstract_device", None)
  platform = device.platform if device is not None else jax.default_backend()
  return (mesh.empty or mesh.size == 1) and platform == "cpu" and _load()


def usable() -> bool:
  """Whether the function being traced may call the kernels: on CPU, not under a mesh, the
  library built."""
  return (jax.sharding.get_abstract_mesh().empty and jax.default_backend() == "cpu"
          and _load())
