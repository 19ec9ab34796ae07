"""The persistent compilation cache of ``train.py`` and ``eval.py`` (JAX's
``jax_compilation_cache_dir``): a restart of the same config on the same devices and JAX version
loads its compiled steps from storage instead of compiling them again.

Where (first that applies): ``train.compile_cache_dir``; a cache directory this process was
already given (``JAX_COMPILATION_CACHE_DIR``, or a caller's ``jax.config.update``); else
``<workdir>/compile_cache``, on the workdir's storage, so every host of a slice and every restart
after a preemption share it (JAX writes entries from process 0 only). ``train.compile_cache=false``
turns it off. JAX keys each entry by the program, the devices, the compile options, XLA_FLAGS and
the jax/jaxlib versions, so a changed config, topology or version misses instead of loading a wrong
executable. Only ``cfg.train.compile_cache*`` decide: every host takes the same decision.

Whether a compile was served from the cache is read from JAX's monitoring events
(``/jax/compilation_cache/cache_hits`` and ``.../cache_misses``: the latter counts entries written)
and logged with each step's compile (``describe``).
"""
from __future__ import annotations

import dataclasses
import logging
import threading

import jax

from t5like import paths
from t5like.config.train import TrainConfig

log = logging.getLogger("t5like.training")

SUBDIR = "compile_cache"
_HITS = "/jax/compilation_cache/cache_hits"
_WRITES = "/jax/compilation_cache/cache_misses"  # Recorded when an entry is written.
_REQUESTS = "/jax/compilation_cache/compile_requests_use_cache"
_SAVED = "/jax/compilation_cache/compile_time_saved_sec"
_ours: str | None = None  # The directory this module set (None: none, or someone else's).
_outside: tuple | None = None  # The cache settings before this module first changed them.
_lock = threading.Lock()
_counts = {_HITS: 0, _WRITES: 0, _REQUESTS: 0, _SAVED: 0.0}
_listening = False


@dataclasses.dataclass(frozen=True)
class Counts:
  """JAX's cache events so far in this process."""
  requests: int = 0  # Compiles that looked in the cache.
  hits: int = 0  # Served from it.
  writes: int = 0  # Compiled and written to it.
  saved_s: float = 0.0  # Compile seconds the hits saved (as recorded when they were written).


_configured = Counts()


def _on_event(event: str, **kwargs) -> None:
  del kwargs
  if event in (_HITS, _WRITES, _REQUESTS):
    with _lock:
      _counts[event] += 1


def _on_duration(event: str, duration: float, **kwargs) -> None:
  del kwargs
  if event == _SAVED:
    with _lock:
      _counts[_SAVED] += max(0.0, float(duration))


def counts() -> Counts:
  """The cache events so far (listening starts at the first ``configure`` or ``counts``)."""
  global _listening
  with _lock:
    if not _listening:
      jax.monitoring.register_event_listener(_on_event)
      jax.monitoring.register_event_duration_secs_listener(_on_duration)
      _listening = True
    return Counts(_counts[_REQUESTS], _counts[_HITS], _counts[_WRITES], _counts[_SAVED])


def describe(before: Counts | None = None, after: Counts | None = None) -> str:
  """What the cache did between two ``counts()`` (default: since ``configure``): e.g. "compilation cache hit (saved 41.2 s)",
  "compilation cache miss (written)", "not cached (compiled in less than the minimum time)"."""
  before, after = before or _configured, after or counts()
  hits, writes = after.hits - before.hits, after.writes - before.writes
  requests = after.requests - before.requests
  if not jax.config.jax_enable_compilation_cache or not jax.config.jax_compilation_cache_dir:
    return "compilation cache off"
  if requests == 0:
    return "compilation cache not consulted"
  if hits and not writes and hits == requests:
    return f"compilation cache hit (saved {after.saved_s - before.saved_s:.1f} s)"
  parts = [f"{hits} of {requests} programs from the compilation cache"] if hits else [
      "compilation cache miss"]
  if writes:
    parts.append(f"{writes} written to it")
  elif requests > hits:
    parts.append("not written: under train.compile_cache_min_compile_s, or not process 0")
  return ", ".join(parts)


def _given() -> str | None:
  """The cache directory the environment or a caller set (not one this module set)."""
  current = jax.config.jax_compilation_cache_dir
  return _outside[0] if _outside is not None and current == _ours else current


def resolve_dir(train: TrainConfig, workdir: str) -> str | None:
  """The cache directory ``train`` asks for (module docstring), or None when it is off."""
  if not train.compile_cache:
    return None
  if train.compile_cache_dir:
    return paths.resolve(train.compile_cache_dir)
  return _given() or paths.join(paths.resolve(workdir), SUBDIR)


def configure(train: TrainConfig, workdir: str) -> str | None:
  """Points JAX's persistent cache at ``resolve_dir(train, workdir)`` (or turns it off); call
  before the first compile of a run. Returns the directory (None: off)."""
  global _ours, _outside, _configured
  _configured = counts()  # Listen from here on.
  path = resolve_dir(train, workdir)
  if _outside is None:  # What to go back to when a later run in this process asks for it.
    _outside = (jax.config.jax_compilation_cache_dir, jax.config.jax_enable_compilation_cache,
                jax.config.jax_persistent_cache_min_compile_time_secs,
                jax.config.jax_persistent_cache_min_entry_size_bytes)
  given = _given()
  if path is None:
    settings = (jax.config.jax_compilation_cache_dir, False) + _outside[2:]
  elif path == given:  # The environment's or a caller's cache, with their thresholds.
    settings = (path, True) + _outside[2:]
  else:
    settings = (path, True, float(train.compile_cache_min_compile_s), 0)
  if path is not None:
    _ours = None if path == given else path
  names = ("jax_compilation_cache_dir", "jax_enable_compilation_cache",
           "jax_persistent_cache_min_compile_time_secs",
           "jax_persistent_cache_min_entry_size_bytes")
  now = tuple(getattr(jax.config, n) for n in names)
  if now != settings:
    for name, value in zip(names, settings):
      jax.config.update(name, value)
    _reset()  # The cache opens its directory once: a changed one needs a fresh start.
  log.info("compilation cache: %s", path or "off (train.compile_cache=false)")
  return path


def configure_for_eval(path: str, overrides: list[str]) -> str | None:
  """``eval.py``: the cache of the run it evaluates (its checkpoint's ``train.compile_cache*``,
  then ``--config.train.compile_cache*`` overrides), by default at ``<path>/compile_cache``."""
  from t5like.config import Config, apply_overrides
  from t5like.training import step_dirs
  cfg = Config()
  try:
    saved = step_dirs.read_step_config(step_dirs.resolve_step_dir(path)) or {}
  except Exception:  # noqa: BLE001 - eval.py reports a missing or unreadable checkpoint itself.
    saved = {}
  for key in ("compile_cache", "compile_cache_dir", "compile_cache_min_compile_s"):
    if key in saved.get("train", {}):
      setattr(cfg.train, key, type(getattr(cfg.train, key))(saved["train"][key]))
  apply_overrides(cfg, [o for o in overrides if o.startswith("train.compile_cache")])
  return configure(cfg.train, path)


def turn_off(why: str) -> None:
  """No persistent cache for this process's compiles from here on (``why`` is logged)."""
  if jax.config.jax_enable_compilation_cache:
    jax.config.update("jax_enable_compilation_cache", False)
    _reset()
  log.info("compilation cache: off (%s)", why)


def _reset() -> None:
  from jax.experimental.compilation_cache import compilation_cache as cc
  cc.reset_cache()
