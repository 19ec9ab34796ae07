"""The operations the model calls, and the one place that chooses who computes them.

``t5like/models`` is the architecture in reference form; every product, norm, rotation,
attention core and argmax it computes goes through a backend (``backend(cfg)``), whose
reference forms (``reference.py``: plain ``jnp`` / ``jax.nn``) define the values:

==============  ========================================================================
``reference``   the formulas as written (``reference.py``).
``xla``         the forms XLA:CPU measurements chose, for any device (``xla.py``).
``xla_cpu``     ``xla`` plus XLA:CPU's fast-path layouts and custom VJPs (``xla_cpu.py``).
``cpu_kernels`` ``xla_cpu`` plus the C++ kernels of ``t5like/kernels`` (``cpu_kernels.py``).
==============  ========================================================================

``model.attention_impl`` (``splash`` / ``cudnn``) picks the fused core any backend hands a
``MaskSpec`` mask to (``fused_attention.py``).

Choice (``resolve``, once per run, where the model is built; logged): ``model.ops``, by
default ``auto``: on CPU devices ``cpu_kernels`` where the kernels' library is built and the
run is on one device, else ``xla_cpu``; on TPU/GPU ``xla`` (on TPU, XLA's cost model estimates
``reference`` faster, but some of its programs need more memory, e.g. redllm_1b at
``dots_no_batch``: not switched without a TPU step time, docs/compile.md). The platform is that of
the mesh's devices when a mesh is given (an ahead-of-time compile for a TPU slice on a CPU
host), else JAX's default backend, so every host decides alike. Overrides, read only here:
``T5LIKE_OPS=<backend>`` replaces ``model.ops``; ``T5LIKE_CPU_KERNELS=0`` turns ``auto``'s
``cpu_kernels`` into ``xla_cpu``.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os

import jax

from t5like.kernels.attention_train import RESIDUALS
from t5like.ops.reference import Reference, Rotary

log = logging.getLogger(__name__)

BACKENDS = ("reference", "xla", "xla_cpu", "cpu_kernels")
ENV_OPS = "T5LIKE_OPS"
ENV_CPU_KERNELS = "T5LIKE_CPU_KERNELS"
# Activations the kernels' forward names for a remat policy to keep (``models.stack``).
SAVED_NAMES = (RESIDUALS,)


def _platform_and_devices(mesh) -> tuple[str, int]:
  if mesh is None:
    return jax.default_backend(), 1
  if isinstance(mesh, jax.sharding.AbstractMesh):
    return mesh.abstract_device.platform, mesh.size
  return mesh.devices.flat[0].platform, mesh.devices.size


def choose(ops: str, mesh=None) -> str:
  """The backend ``model.ops = ops`` means on ``mesh``'s devices (None: this process's default
  backend, unpartitioned), after the environment overrides."""
  ops = os.environ.get(ENV_OPS) or ops
  if ops not in ("auto",) + BACKENDS:
    raise ValueError(f"model.ops={ops!r} is not one of auto, {', '.join(BACKENDS)}")
  if ops != "auto":
    return ops
  platform, devices = _platform_and_devices(mesh)
  if platform != "cpu":
    return "xla"
  from t5like.kernels import library
  kernels = devices == 1 and os.environ.get(ENV_CPU_KERNELS, "1") != "0" and library.built()
  return "cpu_kernels" if kernels else "xla_cpu"


def resolve(cfg, mesh=None):
  """``cfg`` (a ModelConfig) with ``ops`` a concrete backend (``choose``); unchanged if it is."""
  if cfg.ops in BACKENDS and not os.environ.get(ENV_OPS):
    return cfg
  chosen = choose(cfg.ops, mesh)
  _log_choice(chosen, cfg.ops, cfg.attention_impl)
  return dataclasses.replace(cfg, ops=chosen)


@functools.cache
def _log_choice(chosen: str, ops: str, attention_impl: str) -> None:
  """Once per process and decision: a run builds its model more than once."""
  log.info("model ops: %s (model.ops=%r, model.attention_impl=%r)", chosen, ops, attention_impl)


@functools.cache
def _backend(name: str, attention_impl: str, max_segments_per_row: int) -> Reference:
  if name == "reference":
    cls = Reference
  elif name == "xla":
    from t5like.ops.xla import Xla as cls
  elif name == "xla_cpu":
    from t5like.ops.xla_cpu import XlaCpu as cls
  elif name == "cpu_kernels":
    from t5like.ops.cpu_kernels import CpuKernels as cls
  else:
    raise ValueError(f"model.ops={name!r} is not resolved (ops.resolve) to one of {BACKENDS}")
  return cls(attention_impl, max_segments_per_row)


def backend(cfg) -> Reference:
  """The backend of a ModelConfig: a look-up where ``resolve`` made ``cfg.ops`` concrete (the
  models do, where they are built), else ``choose`` on this process's default backend."""
  name = cfg.ops if cfg.ops in BACKENDS else choose(cfg.ops)
  return _backend(name, cfg.attention_impl, cfg.max_segments_per_row)


__all__ = ["BACKENDS", "Reference", "Rotary", "SAVED_NAMES", "backend", "choose", "resolve"]
