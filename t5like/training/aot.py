"""Ahead-of-time compilation: "does this config fit, and how fast will it be?" before a run.

``compile_report(cfg, devices)`` builds the run's real sharded state layout, lowers and compiles
the real train step (microbatches, remat, donation) and eval step for ``devices`` — the local
ones, or the devices of a TPU topology that does not exist here (``topology_devices``, needs
libtpu: ``pip install -e '.[tpu]'``) — and reports per chip: argument / output / temporary bytes
against the chip's HBM, the step's FLOPs (paper convention, ``flops.py``; XLA's cost analysis
counts a scanned layer once, so it is not used), a roofline estimate of step time and MFU, and
compile time. ``check_fits`` is the same memory check on the devices of a real run, before its
first step (``Trainer.train``).

The roofline brackets the step time between the longest (perfect overlap: an upper bound on
MFU) and the sum (no overlap) of three terms: executed FLOPs / peak — the model's FLOPs plus the
forward pass a remat policy recomputes —, HBM bytes / HBM bandwidth, and FSDP collective bytes /
ICI bandwidth. Both assume the matrix units run at peak on every FLOP; elementwise work (norms,
softmax, RoPE) and kernel launch gaps are not modelled, so a measured MFU is lower still.
HBM bytes: parameters, gradients and optimizer state read and written once
per microbatch-accumulated step plus the compiled temporaries written and read once; ICI bytes:
the FSDP all-gather of the parameters (forward and backward, per microbatch) and the
reduce-scatter of the gradients. On several slices a fourth term, DCN: the bytes the compiled
program moves between slices (``dcn.megascale_bytes``) at the chip's DCN bandwidth.
"""
from __future__ import annotations

import dataclasses
import math
import re
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp

from t5like import ops, partitioning
from t5like.config import Config, ConfigError
from t5like.training import compile_cache, dcn
from t5like.training import flops as flops_lib
from t5like.training import state as state_lib
from t5like.training import step as step_lib

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
  """Public per-chip figures of a Cloud TPU generation (cloud.google.com/tpu/docs)."""
  name: str
  hbm_bytes: float  # HBM capacity.
  peak_flops: float  # Dense bf16 FLOP/s.
  hbm_bw: float  # HBM bandwidth, bytes/s.
  ici_bw: float  # Inter-chip interconnect bandwidth per chip, bytes/s (all links).
  cores_per_chip: int  # TensorCores per chip: the "-N" of a v4/v5p slice name counts cores.
  dims: int  # Torus dimensions of the topology (2 for v5e/v6e, 3 for v4/v5p).


CHIPS = {
    "v4": Chip("v4", 32 * GiB, 275e12, 1.2e12, 300e9, 2, 3),
    "v5p": Chip("v5p", 95 * GiB, 459e12, 2.765e12, 600e9, 2, 3),
    "v5e": Chip("v5e", 16 * GiB, 197e12, 819e9, 200e9, 1, 2),
    "v6e": Chip("v6e", 32 * GiB, 918e12, 1.64e12, 448e9, 1, 2),
}
# Fraction of the forward FLOPs that a remat policy recomputes in the backward pass: "full"
# saves nothing; the dot-saving policies recompute only elementwise work (FLOP-free here);
# "attention_out" keeps only the attention output, so about all but its output projection is
# recomputed (estimate).
RECOMPUTED_FORWARD = {"none": 0.0, "full": 1.0, "dots": 0.0, "dots_no_batch": 0.0,
                      "attention_out": 0.85}
HEADROOM = 0.2  # A config "fits" when it leaves at least this fraction of HBM free.


def parse_topology(name: str) -> tuple[Chip, str]:
  """``v5p-128`` (Cloud slice name: TensorCores for v4/v5p, chips for v5e/v6e) or ``v5p:4x4x4``
  -> (chip, topology name for ``get_topology_desc``)."""
  m = re.fullmatch(r"(v4|v5p|v5e|v6e)([-:])([0-9x]+)", name.strip().lower())
  if not m:
    raise ConfigError(f"unknown TPU topology {name!r}; use a slice name like v5p-128, v5e-256, "
                      f"v6e-64, v4-32, or chip:shape like v5p:4x4x4 (chips: {sorted(CHIPS)})")
  chip, sep, rest = CHIPS[m.group(1)], m.group(2), m.group(3)
  if sep == ":":
    return chip, f"{chip.name}:{rest}"
  count = int(rest)
  if count % chip.cores_per_chip:
    raise ConfigError(f"{name}: a {chip.name} slice counts {chip.cores_per_chip} cores per chip")
  chips = count // chip.cores_per_chip
  shape = _torus(chips, chip.dims)
  if shape is None:
    raise ConfigError(f"{name}: {chips} chips is not a {chip.name} slice shape")
  return chip, f"{chip.name}:{'x'.join(map(str, shape))}"


def _torus(chips: int, dims: int) -> list[int] | None:
  """Slice shape of ``chips`` chips as Cloud TPU names them: doublings spread over the axes,
  ascending, size-1 axes last (v5p: 2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4, 4x4x8; v5e: 2x2, 2x4, 4x4,
  ..., 16x16)."""
  if chips < 1 or chips & (chips - 1):
    return None
  shape = [1] * dims
  for i in range(int(math.log2(chips))):
    shape[i % dims] *= 2
  return sorted(d for d in shape if d > 1) + [1] * shape.count(1)


def topology_devices(name: str, num_slices: int = 1) -> tuple[Chip, list[Any]]:
  """Devices of a TPU topology that need not exist (compile only); ``num_slices`` such slices
  joined over DCN (the devices carry ``slice_index``), also written ``2xv5p-128``."""
  many = re.fullmatch(r"\s*([0-9]+)\s*x\s*(v.+)", name.lower())
  if many:
    num_slices, name = num_slices * int(many.group(1)), many.group(2)
  chip, topo = parse_topology(name)
  from t5like import runtime
  chips = math.prod(int(d) for d in topo.split(":")[1].split("x"))
  runtime.libtpu_env_for_compile_only(  # Cloud's accelerator names: v5e is "v5litepod".
      f"{'v5litepod' if chip.name == 'v5e' else chip.name}-{chips * chip.cores_per_chip}")
  runtime.libtpu_init_args()  # Its compiler's fiber stacks (a paper config overflowed them).
  try:
    from jax.experimental import topologies
    desc = topologies.get_topology_desc(platform="tpu", topology_name=topo,
                                        **({"num_slices": num_slices} if num_slices > 1 else {}))
  except Exception as e:  # noqa: BLE001 - libtpu missing or topology unknown to it.
    why = str(e).splitlines()[0][:200] if str(e) else ""
    hint = ("another process holds libtpu; a host without TPUs may compile in several "
            "processes at once with ALLOW_MULTIPLE_LIBTPU_LOAD=1" if "lockfile" in why else
            "ahead-of-time TPU compiles need libtpu: pip install -e '.[tpu]'")
    raise ConfigError(f"cannot describe TPU topology {topo} ({type(e).__name__}: {why}); "
                      f"{hint}") from None
  return chip, list(desc.devices)


def abstract_batch(cfg: Config, sharding, rows: int) -> dict[str, jax.ShapeDtypeStruct]:
  """The model features of one global batch, as the data pipeline emits them."""
  from t5like.data import pipeline
  lengths = pipeline.model_feature_lengths(cfg)
  return {k: jax.ShapeDtypeStruct((rows, n), jnp.int32, sharding=sharding)
          for k, n in lengths.items()}


def memory_per_device(compiled) -> dict[str, int]:
  m = compiled.memory_analysis()
  out = {"arguments": m.argument_size_in_bytes, "outputs": m.output_size_in_bytes,
         "aliased": m.alias_size_in_bytes, "temporaries": m.temp_size_in_bytes,
         "code": m.generated_code_size_in_bytes}
  out["peak"] = (out["arguments"] + out["outputs"] - out["aliased"] + out["temporaries"]
                 + out["code"])
  return out


def _lengths(cfg: Config) -> tuple[int, int]:
  from t5like.data import pipeline
  lengths = pipeline.model_feature_lengths(cfg)
  return lengths["decoder_target_tokens"], lengths.get("encoder_input_tokens", 0)


def _state_bytes(setup: state_lib.TrainSetup) -> tuple[int, int]:
  """Bytes one device holds of the parameters and of the optimizer state."""
  st, sh = setup.abstract_state, setup.state_shardings
  return (partitioning.bytes_per_device(st.params, sh.params),
          partitioning.bytes_per_device(st.opt_state, sh.opt_state))


def activation_estimates(cfg: Config, setup: state_lib.TrainSetup) -> dict[str, float]:
  """Rough bytes per device of the big consumers, to name the largest when a config does not
  fit (the compiled totals do not say which buffer is which)."""
  m, t = cfg.model, cfg.train
  shards = partitioning.data_shards(setup.mesh)
  tensor = setup.mesh.shape.get("tensor", 1)
  rows = max(1, t.batch_size // t.microbatches // shards)
  dec, enc = _lengths(cfg)
  act = 2 if m.dtype == "bfloat16" else 4
  layers = m.num_layers if m.family == "decllm" else m.num_encoder_layers + m.num_decoder_layers
  tokens = rows * (dec + enc)
  saved = 1 if m.remat_policy == "full" else 12  # Per-layer [tokens, d] tensors kept for bwd.
  fused = ops.backend(ops.resolve(m, setup.mesh)).fused
  params, opt_state = _state_bytes(setup)
  return {
      "parameters + optimizer state": float(params + opt_state),
      "gradients": float(params),
      "logits (f32, with their gradient)": 3.0 * rows * dec * m.vocab_size * 4 / tensor,
      "attention scores (per layer, f32)": (2.0 * rows * m.num_heads * max(dec, enc) ** 2 * 4
                                            / tensor if not fused else 0.0),
      "layer activations kept for the backward pass": float(layers * saved * tokens * m.d_model
                                                            * act),
  }


_FIXES = {
    "parameters + optimizer state": "spread the state over more chips (mesh.fsdp) or rent a "
                                    "larger slice",
    "gradients": "spread the state over more chips (mesh.fsdp)",
    "logits (f32, with their gradient)": "raise train.microbatches (fewer rows at a time) or "
                                         "shard the vocabulary over mesh.tensor",
    "attention scores (per layer, f32)": "model.attention_impl=splash (TPU) or cudnn (GPU), "
                                         "raise train.microbatches, or model.remat_policy=full",
    "layer activations kept for the backward pass": "model.remat_policy=full (or dots_no_batch), "
                                                    "or raise train.microbatches",
}


def largest_consumer(estimates: dict[str, float]) -> tuple[str, float, str]:
  name = max(estimates, key=estimates.get)
  return name, estimates[name], _FIXES[name]


def roofline(cfg: Config, setup: state_lib.TrainSetup, chip: Chip | None, peak_flops: float,
             mem: dict[str, int], traffic: dict[str, int] | None = None) -> dict[str, float]:
  """FLOPs per chip and the roofline step time / MFU (see the module docstring)."""
  n = setup.mesh.size
  dec, enc = _lengths(cfg)
  total = flops_lib.train_flops(cfg.model, cfg.train.batch_size, dec, enc)
  # Executed FLOPs: rematerialisation recomputes the forward pass (1/3 of fwd+bwd) for the
  # layers' matmuls it does not save; MFU counts only the model's FLOPs.
  executed = total * (1 + RECOMPUTED_FORWARD[cfg.model.remat_policy] / 3)
  out = {"flops_per_chip": total / n,
         "compute_s": executed / n / peak_flops if peak_flops else 0.0,
         "model_compute_s": total / n / peak_flops if peak_flops else 0.0}
  if chip is None:
    return out
  st = setup.abstract_state
  params, opt_state = _state_bytes(setup)
  hbm = 2 * (params + opt_state + params) + 2 * mem["temporaries"]  # State, then gradients.
  full_params = sum(x.size * (2 if cfg.model.dtype == "bfloat16" else 4)
                    for x in jax.tree.leaves(st.params))
  fsdp = setup.mesh.shape.get("fsdp", 1)  # Inside a slice (FSDP over DCN: its DCN bytes apart).
  fsdp //= partitioning.device_slices(setup.mesh.devices.flat) if cfg.mesh.dcn_axis == "fsdp" else 1
  gathers = (2 * cfg.train.microbatches + 1) * full_params * (fsdp - 1) / fsdp if fsdp > 1 else 0
  out.update(hbm_s=hbm / chip.hbm_bw, ici_s=gathers / chip.ici_bw)
  terms = ["compute_s", "hbm_s", "ici_s"]
  if traffic is not None and traffic["ops"]:
    out["dcn_bytes"] = max(traffic["send"], traffic["recv"])
    dcn_s = dcn.dcn_seconds(traffic, chip.name)
    if dcn_s is not None:
      out["dcn_s"] = dcn_s
      terms.append("dcn_s")
  out["step_s"] = max(out[k] for k in terms)  # Perfect overlap.
  out["step_serial_s"] = sum(out[k] for k in terms)  # No overlap at all.
  out["mfu"] = out["model_compute_s"] / out["step_s"] if out["step_s"] else 0.0
  out["mfu_serial"] = out["model_compute_s"] / out["step_serial_s"] if out["step_s"] else 0.0
  return out


def compile_report(cfg: Config, devices: Sequence[Any] | None = None, *,
                   chip: Chip | None = None, eval_step: bool = True,
                   hbm_bytes: float = 0.0) -> dict[str, Any]:
  """Compiles the train (and eval) step of ``cfg`` for ``devices``; returns the report dict.
  ``hbm_bytes``: the memory per device to fit in (default: the chip's or the device's)."""
  devices = list(jax.devices() if devices is None else devices)
  mesh = partitioning.make_mesh(cfg.mesh, devices)
  state_lib.check_batch_layout(cfg, mesh)
  setup = state_lib.build_setup(cfg, mesh)
  t0, cache_before = time.time(), compile_cache.counts()
  batch = abstract_batch(cfg, setup.batch_sharding, cfg.train.batch_size)
  lowered = step_lib.make_train_step(setup).lower(setup.abstract_state, batch)
  report: dict[str, Any] = {
      "devices": len(devices), "device_kind": devices[0].device_kind,
      "slices": partitioning.device_slices(devices),
      "mesh": dict(mesh.shape), "num_params": setup.num_params,
      "sparsecore_collectives": bool(partitioning.compiler_options(cfg.mesh, mesh))}
  traffic = None
  try:
    compiled = lowered.compile()
    report["train"] = memory_per_device(compiled)
    if report["slices"] > 1:
      traffic = report["dcn_traffic"] = dcn.megascale_bytes(compiled.as_text())
  except jax.errors.JaxRuntimeError as e:  # The TPU compiler refuses what cannot fit its HBM.
    report["train"] = _refused(e, cfg, setup)
    report["compile_error"] = str(e).splitlines()[0][:300]
    eval_step = False
  report["compile_s"] = report["compile_train_s"] = time.time() - t0
  if eval_step:
    rows = cfg.train.eval_batch_size or cfg.train.batch_size
    t1 = time.time()
    ev = step_lib.make_eval_step(setup).lower(
        setup.abstract_state.params, abstract_batch(cfg, setup.batch_sharding, rows),
        setup.abstract_state.model_state).compile()
    report["eval"] = memory_per_device(ev)
    report["compile_s"] += time.time() - t1
  report["compile_cache"] = compile_cache.describe(cache_before)
  hbm = hbm_bytes or (chip.hbm_bytes if chip else device_memory_limit(devices[0]))
  peak = chip.peak_flops if chip else flops_lib.peak_flops_per_device(
      cfg.train.peak_flops_per_device, cfg.model.dtype)
  report["hbm_bytes"] = hbm
  need = max(report["train"]["peak"], report.get("eval", {}).get("peak", 0))
  report["fits"] = bool(hbm) and need <= (1 - HEADROOM) * hbm
  report["headroom"] = 1 - need / hbm if hbm else float("nan")
  report["largest_consumer"] = largest_consumer(activation_estimates(cfg, setup))
  report.update(roofline(cfg, setup, chip, peak, report["train"], traffic))
  return report


def device_memory_limit(device) -> float:
  """Bytes one device may use: the accelerator's limit, or on CPU the host's available memory
  shared by its local CPU devices (0 if unknown)."""
  try:
    stats = device.memory_stats()
  except Exception:  # noqa: BLE001 - not every backend reports it.
    stats = None
  if stats and stats.get("bytes_limit"):
    return float(stats["bytes_limit"])
  if device.platform == "cpu":
    try:
      with open("/proc/meminfo") as f:
        info = dict(line.split(":", 1) for line in f)
      return float(info["MemAvailable"].split()[0]) * 1024 / max(1, jax.local_device_count())
    except (OSError, KeyError, ValueError):
      return 0.0
  return 0.0


def _size(match: re.Match) -> int:
  """Bytes of a libtpu size ("103.36" and "G" as a match's two groups)."""
  return int(float(match.group(1)) * 1024 ** ("KMGT".index(match.group(2)) + 1))


def _refused(error: Exception, cfg: Config, setup: state_lib.TrainSetup) -> dict[str, int]:
  """Memory of a step the compiler refused for lack of HBM, from either of libtpu's messages:
  "the total memory required for HLO temporaries (103.36G) exceeds available HBM (95.74G)", or
  "CompileTimeHbmOom: ... Used 16.13G of 15.75G hbm" (the whole program's use)."""
  msg = str(error)
  temps = re.search(r"temporaries \(([0-9.]+)([KMGT])\)", msg)
  used = re.search(r"Used ([0-9.]+)([KMGT]) of [0-9.]+[KMGT] hbm", msg)
  if "RESOURCE_EXHAUSTED" not in msg or not (temps or used):
    raise error
  args = sum(_state_bytes(setup))
  temporaries = _size(temps) if temps else max(0, _size(used) - args)
  return {"arguments": args, "outputs": args, "aliased": args, "temporaries": temporaries,
          "code": 0, "peak": args + temporaries}


def compile_checked(cfg: Config, setup: state_lib.TrainSetup, lowered):
  """Compiles a run's train step and checks its memory before the first step: a step that cannot
  fit (the accelerator compiler refusing it, or more than the devices hold) is a ConfigError
  saying how much it needs and what to change."""
  try:
    compiled = lowered.compile()
  except jax.errors.JaxRuntimeError as e:
    mem = _refused(e, cfg, setup)  # Re-raises anything but an out-of-memory refusal.
    _raise_too_big(cfg, setup, mem, device_memory_limit(jax.local_devices()[0]))
  check_fits(cfg, setup, compiled)
  return compiled


def _raise_too_big(cfg: Config, setup: state_lib.TrainSetup, mem: dict[str, int], limit: float):
  name, size, fix = largest_consumer(activation_estimates(cfg, setup))
  has = f"has {limit / GiB:.2f} GiB" if limit else "has less"
  raise ConfigError(
      f"the train step needs {mem['peak'] / GiB:.2f} GiB per device (arguments "
      f"{mem['arguments'] / GiB:.2f} + temporaries {mem['temporaries'] / GiB:.2f} GiB) but a "
      f"{jax.local_devices()[0].device_kind} device {has}. Largest consumer (estimate): {name}, "
      f"~{size / GiB:.2f} GiB per device: {fix}. Check a config before a run with: python "
      "train.py --config ... --compile_only [--topology v5p-128]")


def check_fits(cfg: Config, setup: state_lib.TrainSetup, compiled) -> dict[str, int]:
  """Raises ConfigError before the first step when the compiled train step needs more memory
  per device than the devices have (no headroom demanded: the run may try)."""
  mem = memory_per_device(compiled)
  limit = device_memory_limit(jax.local_devices()[0])
  if limit and mem["peak"] > limit:
    _raise_too_big(cfg, setup, mem, limit)
  return mem


def format_report(name: str, r: dict[str, Any]) -> str:
  t = r["train"]
  slices = f" ({r['slices']} slices over DCN)" if r.get("slices", 1) > 1 else ""
  lines = [
      f"{name}: {r['num_params'] / 1e6:,.0f}M parameters on {r['devices']} x "
      f"{r['device_kind']}{slices}, mesh {r['mesh']}"
      f"{', collectives on the SparseCores' if r.get('sparsecore_collectives') else ''}, "
      f"compiled in {r['compile_s']:.1f} s "
      f"(train step {r['compile_train_s']:.1f} s; {r['compile_cache']})",
      f"  train step per chip: arguments {t['arguments'] / GiB:.2f} GiB, outputs "
      f"{t['outputs'] / GiB:.2f} GiB (aliased {t['aliased'] / GiB:.2f}), temporaries "
      f"{t['temporaries'] / GiB:.2f} GiB -> peak {t['peak'] / GiB:.2f} GiB"]
  if "eval" in r:
    lines.append(f"  eval step per chip: peak {r['eval']['peak'] / GiB:.2f} GiB")
  if r["hbm_bytes"]:
    lines.append(f"  memory per chip {r['hbm_bytes'] / GiB:.1f} GiB: "
                 f"{'fits' if r['fits'] else 'DOES NOT FIT'} (headroom {r['headroom']:.0%}, "
                 f"needed >= {HEADROOM:.0%})")
  lines.append(f"  FLOPs per chip per step: {r['flops_per_chip']:.3e}")
  if "step_s" in r:
    dcn_ = (f", DCN {_secs(r['dcn_s'])} ({r['dcn_bytes'] / 2**20:.3g} MiB/chip)" if "dcn_s" in r
            else ", DCN (no published bandwidth)" if "dcn_bytes" in r else "")
    if r.get("dcn_traffic", {}).get("loops_uncounted"):
      dcn_ += (f" (a lower bound: {r['dcn_traffic']['loops_uncounted']} loop(s) of unknown trip "
               "count counted once)")
    lines.append(f"  roofline: compute {_secs(r['compute_s'])}, HBM {_secs(r['hbm_s'])}, ICI "
                 f"{_secs(r['ici_s'])}{dcn_} -> step {_secs(r['step_s'])} (overlapped) to "
                 f"{_secs(r['step_serial_s'])} (serial), MFU {r['mfu_serial']:.0%}-{r['mfu']:.0%}")
  if "fit" in r:
    lines.append(f"  train.fit=auto would take: {r['fit']['setting']}" if "setting" in r["fit"]
                 else f"  train.fit=auto finds no setting: {r['fit']['error']}")
  if "compile_error" in r:
    lines.append(f"  the TPU compiler refused the step: {r['compile_error']}")
  if not r["fits"]:
    name_, size, fix = r["largest_consumer"]
    lines.append(f"  largest consumer (estimate): {name_} ~{size / GiB:.2f} GiB: {fix}")
  return "\n".join(lines)


def _secs(s: float) -> str:
  return f"{s:.3f} s" if s >= 1 else f"{s * 1e3:.2f} ms"

