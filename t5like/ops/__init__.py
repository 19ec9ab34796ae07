"""The operations the model calls, and the one place that chooses its attention core.

``t5like/models`` is the architecture; every product, norm, rotation, attention core and argmax
it computes goes through ``backend(cfg)``: the reference forms of ``reference.py`` (plain
``jnp`` / ``jax.nn``, the paper's formulas), the same on every platform. The only other
implementations are the fused attention cores of ``fused_attention.py`` (``splash`` on TPUs,
``cudnn`` / cuDNN's packed layout on NVIDIA GPUs), which take a ``models.masks.MaskSpec``
instead of a materialised ``[batch, heads, q, kv]`` mask.

``model.attention_impl`` (``resolve``, once where the model is built; logged with its reason):
``auto`` (the default) picks by the mesh's platform — an ahead-of-time compile for a TPU slice on
a CPU host decides as the slice would, and every host alike:

- TPU: ``splash`` for every config it serves (not: attention-probability dropout, a mixed
  forward/backward PrefixLM mask);
- GPU: ``cudnn`` on Hopper or newer (compute capability >= 9) in bfloat16 / float16 with causal
  or full masks, head_dim a multiple of 8 up to 256 and no attention dropout (packed rows through
  the packed layout);
- otherwise (CPU; the configs above the fused cores cannot serve) ``reference``, the core of
  ``reference.py`` over the materialised mask.

An explicit ``splash`` / ``cudnn`` that cannot serve the config is a ``ConfigError`` naming why
(``ModelConfig.validate``). Decoding over the KV cache runs the reference core.
"""
from __future__ import annotations

import dataclasses
import functools
import logging

import jax

from t5like.config.schema import ConfigError
from t5like.ops.reference import Reference, Rotary

log = logging.getLogger(__name__)

FUSED = {"tpu": "splash", "gpu": "cudnn"}  # The fused core each accelerator platform has.


def _platform_and_device(mesh):
  if mesh is None:
    return jax.default_backend(), jax.devices()[0]
  if isinstance(mesh, jax.sharding.AbstractMesh):
    return mesh.abstract_device.platform, None
  device = mesh.devices.flat[0]
  return device.platform, device


def choose_attention(cfg, mesh=None) -> tuple[str, str]:
  """(core, reason): what ``model.attention_impl="auto"`` means for ``cfg`` (a ModelConfig) on
  ``mesh``'s devices (None: this process's default backend)."""
  platform, device = _platform_and_device(mesh)
  fused = FUSED.get(platform)
  if fused is None:
    return "reference", f"no fused attention core on {platform!r}"
  if fused == "cudnn":
    capability = getattr(device, "compute_capability", None)
    major = int(str(capability).split(".")[0]) if capability else 0
    if major < 9:
      return "reference", (f"cuDNN attention is chosen on Hopper or newer GPUs; compute "
                           f"capability {capability or 'unknown'}")
  try:
    cfg._check_attention_impl(fused)
  except ConfigError as e:
    return "reference", f"{fused} cannot serve this config: {e}"
  return fused, f"the fused core of {platform!r}"


def resolve(cfg, mesh=None):
  """``cfg`` (a ModelConfig) with ``attention_impl`` a concrete core; unchanged if it is."""
  if cfg.attention_impl != "auto":
    return cfg
  core, reason = choose_attention(cfg, mesh)
  _log_choice(core, reason)
  return dataclasses.replace(cfg, attention_impl=core)


@functools.cache
def _log_choice(core: str, reason: str) -> None:
  """Once per process and decision: a run builds its model more than once."""
  log.info("model.attention_impl='auto': %s (%s)", core, reason)


def serves_leading_padding(cfg) -> bool:
  """Whether ``cfg``'s attention core attends rows whose padding comes first (generation's
  left-padded prompts): the reference core and splash do; cuDNN does not (its prefill runs on
  the reference core)."""
  from t5like.ops import fused_attention  # pylint: disable=g-import-not-at-top
  return fused_attention.SERVES_LEADING_PADDING.get(resolve(cfg).attention_impl, True)


def backend(cfg) -> Reference:
  """The operations of a ModelConfig (``attention_impl`` resolved for this process's default
  backend where ``resolve`` has not made it concrete)."""
  return Reference.of(resolve(cfg))


__all__ = ["Reference", "Rotary", "backend", "choose_attention", "resolve",
           "serves_leading_padding"]
