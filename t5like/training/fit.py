"""Configs that fit as shipped: ``train.fit`` picks the remat policy and microbatches.

Before the first step the run compiles its train and eval steps for the devices at hand
(``aot.compile_report``). With ``train.fit``:

- ``auto`` (the default on TPU and GPU): if the configured ``model.remat_policy`` /
  ``train.microbatches`` leave less than ``aot.HEADROOM`` (20 %) of the memory free, the
  candidate settings the TPU table searches (``CANDIDATES``) are compiled in turn and the first
  that fits is taken; the choice and the rejected settings are logged. On a TPU the candidates
  go in order of their roofline step time predicted before compiling (``predicted_step_s``: the
  chip's FLOPs and bandwidths against the config's FLOPs, recomputation and FSDP gathers), so
  the first that fits is the fastest by that model; elsewhere in ``CANDIDATES``' order. On a TPU
  a configured setting that fits is also replaced by the first candidate predicted faster that
  fits (the shipped configs' ``full`` remat where ``dots_no_batch`` with more microbatches fits);
  ``off`` keeps it. Every host takes process 0's choice. The persistent compilation cache makes the search a one-time
  cost per config and topology.
- ``check``: the same search, but a config that does not fit is an error naming the setting that
  would (``--config.model.remat_policy=... --config.train.microbatches=...``).
- ``off``: trusts the config (the trainer still refuses a step that exceeds the memory).
- ``""``: ``auto`` on TPU and GPU, ``off`` on CPU (where host memory is the limit).

The memory: the device's own limit, or ``train.fit_budget_gib`` per device (a budget to respect,
e.g. a share of a chip, or a CPU test's). ``train.py --compile_only`` reports what ``auto`` would
take.
"""
from __future__ import annotations

import copy
import logging
from typing import Any, Callable, Sequence

import jax

from t5like.config import Config, ConfigError
from t5like.training import aot, compile_cache

log = logging.getLogger("t5like.training")

# (remat policy, microbatches). "dots_no_batch" keeps the matmul outputs (no recomputed FLOPs),
# "full" recomputes the forward pass (MFU <= 3/4 of compute-bound); each doubling of microbatches
# adds a pass of the FSDP all-gathers. Without a chip's figures they are tried in this order.
CANDIDATES = [("dots_no_batch", 1), ("dots_no_batch", 2), ("full", 1), ("dots_no_batch", 4),
              ("full", 2), ("dots_no_batch", 8), ("full", 4), ("full", 8), ("full", 16)]
SKIP_ABOVE = 1.5  # Skip a candidate whose summed estimates exceed this multiple of the memory.


def candidate(base: Config, remat: str, microbatches: int, fsdp_split: int = 1) -> Config | None:
  """``base`` with that setting (``fsdp_split`` > 1: that factor of the devices moved from fsdp
  to tensor), or None when the microbatches do not divide the batch."""
  cfg = copy.deepcopy(base)
  cfg.model.remat_policy, cfg.train.microbatches = remat, microbatches
  if fsdp_split > 1:
    cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor = 1, -1, fsdp_split
  if cfg.train.batch_size % microbatches:
    return None
  return cfg


# ``device_kind`` of real TPU chips -> ``aot.CHIPS`` ("TPU v5" is v5p, "TPU v5 lite" v5e).
_KINDS = (("tpu v6", "v6e"), ("tpu v5 lite", "v5e"), ("tpu v5e", "v5e"), ("tpu v5", "v5p"),
          ("tpu v4", "v4"))


def chip_of(device: Any) -> aot.Chip | None:
  """The figures of a real TPU device's chip; None for other devices."""
  if device.platform != "tpu":
    return None
  kind = device.device_kind.lower()
  return next((aot.CHIPS[c] for key, c in _KINDS if key in kind), None)


def predicted_step_s(cfg: Config, setup: Any, chip: aot.Chip) -> float:
  """The roofline step time before compiling: the middle of ``aot.roofline``'s bracket (perfect
  to no overlap) without the compiled temporaries' HBM traffic, which only a compile knows."""
  r = aot.roofline(cfg, setup, chip, chip.peak_flops, {"temporaries": 0})
  return (r["step_s"] + r["step_serial_s"]) / 2


def _queue(base: Config, chip: aot.Chip | None, devices: Sequence[Any], split: int, memory: float,
           log, candidates: list[tuple[str, int]] | None, first: tuple[str, int] | None,
           faster_than: float = 0.0):
  """The settings to compile on this mesh split, in order: ``first``, then ``candidates`` as
  given, or ``CANDIDATES`` by predicted step time (listed order where ``chip`` is None); those
  that cannot be built or whose estimates exceed ``SKIP_ABOVE`` x ``memory`` are logged and left
  out, and with ``faster_than`` those not predicted faster than that. Returns ``(name, remat,
  microbatches, config, predicted seconds or None)`` tuples."""
  from t5like import partitioning
  from t5like.training import state as state_lib
  rest = [c for c in candidates or CANDIDATES if c != first]
  queue = []
  for i, (remat, mb) in enumerate(([first] if first else []) + rest):
    cfg = candidate(base, remat, mb, split)
    if cfg is None:
      continue
    name = f"{remat}/mb{mb}" + (f"/tensor{split}" if split > 1 else "")
    try:
      mesh = partitioning.make_mesh(cfg.mesh, devices)
      state_lib.check_batch_layout(cfg, mesh)
      setup = state_lib.build_setup(cfg, mesh)
    except ConfigError as e:
      log(f"    skip {name}: {str(e)[:160]}")
      continue
    if memory and sum(aot.activation_estimates(cfg, setup).values()) > SKIP_ABOVE * memory:
      log(f"    skip {name}: the estimates alone exceed {SKIP_ABOVE}x the memory")
      continue
    predicted = predicted_step_s(cfg, setup, chip) if chip else None
    if faster_than and (predicted is None or predicted >= faster_than):
      continue
    ordered = candidates is None and chip is not None and not (first and i == 0)
    queue.append(((predicted if ordered else -1.0, i), (name, remat, mb, cfg, predicted)))
  return [item for _, item in sorted(queue, key=lambda q: q[0])]


def search(base: Config, chip: aot.Chip | None, devices: Sequence[Any], log=print,
           max_compiles: int = 8, candidates: list[tuple[str, int]] | None = None,
           splits: Sequence[int] = (1, 4), hbm_bytes: float = 0.0,
           first: tuple[str, int] | None = None,
           faster_than: float = 0.0) -> tuple[dict[str, Any], Config]:
  """Compiles settings in ``_queue``'s order until one fits or ``max_compiles`` were compiled,
  on pure FSDP, then with ``splits``' tensor parallelism; returns the report and config of the
  one that fits (or of the last tried). ``hbm_bytes``: the memory per device (default: the
  chip's or the device's); ``faster_than``: only settings predicted faster than that."""
  memory = hbm_bytes or (chip.hbm_bytes if chip else aot.device_memory_limit(devices[0]))
  last: tuple[dict[str, Any], Config] | None = None
  tried = 0
  for split in splits:
    for name, remat, mb, cfg, predicted in _queue(base, chip, devices, split, memory, log,
                                                  candidates, first, faster_than):
      try:
        report = aot.compile_report(cfg, devices, chip=chip, eval_step=False, hbm_bytes=memory)
      except ConfigError as e:
        log(f"    skip {name}: {str(e)[:160]}")
        continue
      tried += 1
      report.update(remat=remat, microbatches=mb, predicted_step_s=predicted)
      log(f"    {name} mesh {report['mesh']}"
          + (f" (predicted step {predicted:.3g} s)" if predicted else "")
          + f": peak {report['train']['peak'] / aot.GiB:.3g} GiB, fits={report['fits']}"
          + (f", MFU {report['mfu_serial']:.0%}-{report['mfu']:.0%}" if "mfu" in report else ""))
      last = report, cfg
      if report["fits"] or tried >= max_compiles:
        return last
  if last is None:
    raise ConfigError("no candidate setting could be built for these devices")
  return last


def resolve_mode(cfg: Config, platform: str) -> str:
  return cfg.train.fit or ("off" if platform == "cpu" else "auto")


def _budget(cfg: Config) -> float:
  """Memory per device, the same on every host (process 0's)."""
  mine = cfg.train.fit_budget_gib * aot.GiB or aot.device_memory_limit(jax.local_devices()[0])
  if jax.process_count() == 1:
    return mine
  import numpy as np
  from jax.experimental import multihost_utils
  return float(multihost_utils.broadcast_one_to_all(np.float64(mine)))


def _setting(cfg: Config) -> str:
  return (f"--config.model.remat_policy={cfg.model.remat_policy} "
          f"--config.train.microbatches={cfg.train.microbatches}"
          + (f" --config.mesh.tensor={cfg.mesh.tensor} --config.mesh.fsdp={cfg.mesh.fsdp}"
             if cfg.mesh.tensor > 1 else ""))


def choose(cfg: Config, devices: Sequence[Any] | None = None, *, chip: aot.Chip | None = None,
           mode: str | None = None, say: Callable[[str], None] | None = None,
           own: dict[str, Any] | None = None) -> tuple[Config, dict[str, Any]]:
  """The config to run (``cfg`` or the first candidate that fits) and what was decided:
  ``{"mode", "fits", "setting", "rejected", "budget_bytes"}``; ``check`` raises instead of
  changing the setting. ``devices`` default: every device of the run."""
  devices = list(jax.devices() if devices is None else devices)
  mode = mode or resolve_mode(cfg, devices[0].platform)
  say = say or log.info
  if mode == "off":
    return cfg, {"mode": "off"}
  budget = chip.hbm_bytes if chip else _budget(cfg)
  chip = chip or chip_of(devices[0])  # A real TPU's figures: the search's order.
  if own is None:  # The configured setting's compile (``own``: done already).
    own = aot.compile_report(cfg, devices, chip=chip, eval_step=True, hbm_bytes=budget)
  decision = {"mode": mode, "budget_bytes": budget, "configured_peak": own["train"]["peak"],
              "fits": own["fits"], "setting": _setting(cfg), "rejected": []}
  if own["fits"]:
    faster = _faster(cfg, chip, devices, budget) if mode == "auto" and chip else None
    if faster is None:
      say(f"train.fit={mode}: the configured {_setting(cfg)} fits ({own['headroom']:.0%} of "
          f"{budget / aot.GiB:.3g} GiB free)")
      return cfg, decision
    (report, chosen, rejected), (mine, theirs) = faster
    decision.update(setting=_setting(chosen), rejected=rejected, faster=True)
    say(f"train.fit=auto: the configured {_setting(cfg)} fits, but {decision['setting']} fits "
        f"too ({report['headroom']:.0%} free) and is predicted faster on {chip.name} "
        f"({theirs:.3g} s a step against {mine:.3g} s): taking it (train.fit=off keeps the "
        "configured one)" + ("; rejected: " + "; ".join(rejected) if rejected else ""))
    return chosen, decision
  lines: list[str] = []
  report, chosen = search(cfg, chip, devices, log=lines.append, hbm_bytes=budget, splits=(1,))
  decision["rejected"] = [ln.strip() for ln in lines if "fits=True" not in ln]
  found = report["fits"] if jax.process_count() == 1 else _agreed(report["fits"])
  if not found:
    raise ConfigError(
        f"train.fit={mode}: the train step needs {own['train']['peak'] / aot.GiB:.3g} GiB per "
        f"device with {_setting(cfg)}, more than {1 - aot.HEADROOM:.0%} of {budget / aot.GiB:.3g}"
        " GiB, and no candidate remat/microbatch setting fits either:\n  "
        + "\n  ".join(decision["rejected"]) + "\nSpread the state over more devices (mesh.fsdp, "
        "mesh.tensor) or use a larger slice")
  decision["setting"] = _setting(chosen)
  if mode == "check":
    raise ConfigError(
        f"train.fit=check: with {_setting(cfg)} the train step needs "
        f"{own['train']['peak'] / aot.GiB:.3g} GiB per device, more than {1 - aot.HEADROOM:.0%} "
        f"of {budget / aot.GiB:.3g} GiB; pass {decision['setting']} (it fits: "
        f"{report['headroom']:.0%} free), or train.fit=auto to take it by itself")
  say(f"train.fit=auto: the configured {_setting(cfg)} does not fit "
      f"({own['train']['peak'] / aot.GiB:.3g} GiB of {budget / aot.GiB:.3g}); taking "
      f"{decision['setting']} ({report['headroom']:.0%} free); rejected: "
      + "; ".join(decision["rejected"]))
  return chosen, decision


def _faster(cfg: Config, chip: aot.Chip, devices: Sequence[Any], budget: float):
  """On a TPU, where the configured setting fits: the first candidate predicted faster that fits
  too, as ``((report, config, rejected lines), (configured s, its s))``; None if there is none."""
  from t5like import partitioning
  from t5like.training import state as state_lib
  setup = state_lib.build_setup(cfg, partitioning.make_mesh(cfg.mesh, devices))
  mine = predicted_step_s(cfg, setup, chip)
  lines: list[str] = []
  try:
    report, chosen = search(cfg, chip, devices, log=lines.append, hbm_bytes=budget, splits=(1,),
                            faster_than=mine * (1 - 1e-6))
  except ConfigError:  # No candidate is predicted faster.
    return None
  found = report["fits"] if jax.process_count() == 1 else _agreed(report["fits"])
  if not found:
    return None
  rejected = [ln.strip() for ln in lines if "fits=True" not in ln and "skip" not in ln]
  return (report, chosen, rejected), (mine, report["predicted_step_s"])


def _agreed(fits: bool) -> bool:
  """Process 0's verdict on every host (each compiled the same programs)."""
  import numpy as np
  from jax.experimental import multihost_utils
  return bool(multihost_utils.broadcast_one_to_all(np.int32(fits)))


def run_compile_only(cfg: Config, topology: str = "", workdir: str = "",
                     num_slices: int = 1) -> dict[str, Any]:
  """``train.py --compile_only [--topology T]``: compile, print the report, return it. With a
  ``workdir``, the run's compilation cache is used (``compile_cache``): a second call loads the
  compiled steps, and so does the run itself where the devices are the same."""
  if topology:  # JAX's compile-only TPU client cannot load a cached executable: nothing to gain.
    compile_cache.turn_off("a --topology compile cannot load cached executables")
  elif workdir:
    compile_cache.configure(cfg.train, workdir)
  if num_slices > 1 and not topology:
    raise ConfigError("--num_slices needs --topology (the slices of a TPU topology)")
  chip, devices = aot.topology_devices(topology, num_slices) if topology else (None, None)
  report = aot.compile_report(cfg, devices, chip=chip)
  report["topology"] = (f"{num_slices} x " if num_slices > 1 else "") + (topology or "local")
  if not report["fits"] or chip:  # What train.fit=auto would take instead (on a TPU: a faster).
    try:
      decided = choose(cfg, devices, chip=chip, mode="auto", own=report, say=lambda s: None)[1]
    except ConfigError as e:
      decided = {"mode": "auto", "error": str(e).splitlines()[0]}
    if not report["fits"] or decided.get("faster"):
      report["fit"] = decided
  return report
