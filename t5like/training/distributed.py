"""Multi-process start-up: ``jax.distributed.initialize`` from flags or the environment.

Must run before anything touches a JAX backend. Sources, first found wins:
  ``distributed.*`` config fields  >  ``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` /
  ``JAX_PROCESS_ID`` environment variables  >  auto-detection by JAX (TPU pods, SLURM, ...).
With ``distributed.mode="auto"`` the call happens when a coordinator or more than one process is
given, on a multi-host TPU slice (``TPU_WORKER_HOSTNAMES`` lists several hosts), or in a SLURM
job with several tasks; for the last two JAX reads the cluster itself
(``jax.distributed.initialize()`` without arguments) and the log names the cluster. On CPU the
cross-process collectives use gloo.
"""
from __future__ import annotations

import logging
import os

import jax

from t5like.config import ConfigError, DistributedConfig

log = logging.getLogger("t5like.training")


def _env_int(name: str) -> int | None:
  raw = os.environ.get(name, "").strip()
  if not raw:
    return None
  try:
    return int(raw)
  except ValueError:
    raise ConfigError(f"environment variable {name}={raw!r} is not an integer") from None


def _is_multihost_tpu() -> bool:
  hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  return len([h for h in hosts.split(",") if h.strip()]) > 1 or bool(
      os.environ.get("MEGASCALE_COORDINATOR_ADDRESS"))


def detect_cluster() -> str:
  """The multi-process cluster JAX can configure itself on, or "" (then flags/env decide)."""
  if _is_multihost_tpu():
    return "multi-host TPU slice (TPU_WORKER_HOSTNAMES / MEGASCALE_*)"
  tasks = _env_int("SLURM_NTASKS") or _env_int("SLURM_NPROCS") or 1
  if os.environ.get("SLURM_JOB_ID") and tasks > 1:
    return f"SLURM job {os.environ['SLURM_JOB_ID']} ({tasks} tasks)"
  return ""


def _already_initialized() -> bool:
  is_init = getattr(jax.distributed, "is_initialized", None)
  if is_init is not None:
    return bool(is_init())
  from jax._src import distributed as _d  # Older JAX: no public query.
  return _d.global_state.client is not None


def timeouts(cfg: DistributedConfig) -> dict[str, int]:
  """The coordination service's heartbeat / shutdown timeouts for ``jax.distributed.initialize``
  (where this JAX takes them): above the longest compile, or a multi-slice job whose hosts are
  compiling dies with DEADLINE_EXCEEDED / a missed heartbeat."""
  import inspect
  params = inspect.signature(jax.distributed.initialize).parameters
  wanted = {"heartbeat_timeout_seconds": cfg.heartbeat_timeout_s,
            "shutdown_timeout_seconds": cfg.shutdown_timeout_s}
  any_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
  return {k: v for k, v in wanted.items() if any_kw or k in params}


def initialize(cfg: DistributedConfig) -> bool:
  """Initialises the multi-process runtime when ``cfg``/environment asks for it.

  Returns True when this is (now) a multi-process run.
  """
  cfg.validate()
  if _already_initialized():
    return True
  if cfg.mode == "off":
    return False
  address = cfg.coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS", "")
  num = cfg.num_processes or _env_int("JAX_NUM_PROCESSES") or 0
  pid = cfg.process_id if cfg.process_id >= 0 else _env_int("JAX_PROCESS_ID")
  cluster = detect_cluster()
  wanted = cfg.mode == "on" or bool(address) or num > 1 or bool(cluster)
  if not wanted:
    return False
  if cluster:
    log.info("detected cluster: %s", cluster)
  if (address or num) and not (address and num and pid is not None) and not cluster:
    raise ConfigError(
        "a multi-process run on GPU/CPU needs all of distributed.coordinator_address "
        f"(got {address!r}), distributed.num_processes (got {num}) and distributed.process_id "
        f"(got {pid}); or set JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID")
  # Cross-process collectives on CPU devices (no effect on TPU/GPU backends).
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  kwargs = dict(initialization_timeout=cfg.initialization_timeout_s, **timeouts(cfg))
  if address:
    kwargs["coordinator_address"] = address
  if num:
    kwargs["num_processes"] = num
  if pid is not None:
    kwargs["process_id"] = pid
  if cfg.local_device_ids:
    kwargs["local_device_ids"] = [int(x) for x in cfg.local_device_ids.split(",")]
  log.info("jax.distributed.initialize(%s)", kwargs)
  jax.distributed.initialize(**kwargs)
  return True
