#!/usr/bin/env python
"""Train-step throughput and MFU of tiny, small and medium DecLLM / RedLLM configs on this machine.

  python benchmarks/train_throughput.py [--steps 10] [--only tiny_decllm,small_redllm]
                                        [--dtype float32,bfloat16] [--peak 5.69e11]
                                        [--peer] [--alternate] [--compile_scaling]

Times the jitted train step (forward, backward, clipping, Adafactor; synthetic batches already on
device, so the data pipeline is not measured) and prints one table: tokens/s counts every input
position (encoder + decoder), model FLOPs follow docs/flops.md (t5like.training.flops), MFU is
against the device peak (default: on CPU the best of this machine's matmul probes, one after
every row — ``flops.measured_cpu_peak``; accelerators by device kind). Median over ``--steps``
steps after one warm-up (compilation) step. The configs are ``t5like.config.presets``'
``BENCHMARK_CONFIGS``; ``medium_*`` is a 150M-like shape with paper lengths
scaled to fit (d1024, 8 x 128 heads, FFN 4096, vocab 32768, 1024 tokens per row, bf16, full
remat).

``--peer`` adds Hugging Face transformers' ``LlamaForCausalLM`` trained with AdamW on PyTorch at
the ``small_decllm`` shapes (same layers, widths, tied embeddings, batch and length), when torch
and transformers are installed (never a dependency of this project), and prints the ratios. Its
bfloat16 rows: the whole model cast (``.to(bfloat16)``: bf16 weights and optimizer state, the
fastest) and ``torch.autocast`` over f32 weights (the precision of t5like's ``bfloat16``: f32
parameters and optimizer, bf16 matmuls). A peer row stops timing after ~2 minutes of steps
(PyTorch's bf16 without bf16 instructions takes ~80 s a step) and says how many it timed.
``--alternate`` prepares every row first and then times them in ``--steps`` rounds, each row one
step per round after a pause and one untimed step, the order reversed every other round (no
peer time limit: give ``--dtype float32`` where PyTorch's bf16 is that slow): on a shared host
the rows then see the same machine, where rows timed one after the other saw it minutes apart
and their ratio moved ~10-25 % between runs.
``--compile_scaling`` compiles the scanned small DecLLM at 4 and 32 layers and prints the ratio.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # A checkout.

import jax  # noqa: E402

from benchmarks import timing  # noqa: E402
from t5like import partitioning  # noqa: E402
from t5like.config import Config  # noqa: E402
from t5like.config.presets import BENCHMARK_CONFIGS as CONFIGS  # noqa: E402
from t5like.config.presets import BENCHMARK_FIXED_DTYPE as FIXED_DTYPE  # noqa: E402
from t5like.config.presets import small_config  # noqa: E402
from t5like.training import flops  # noqa: E402
from t5like.training import state as state_lib  # noqa: E402
from t5like.training import step as step_lib  # noqa: E402
from t5like.training.data import SyntheticData, global_batch  # noqa: E402


# --alternate: before each timed step, a pause (the previous system's spinning threads go idle)
# and one untimed step of the same system (its buffers back in cache and memory; the first step
# after another system's ran up to ~1.5x slower for the unrolled DecLLM).
PAUSE_S = 1.0
WARM_STEPS = 1
PEER_BUDGET_S = 120.0  # Seconds of peer steps per dtype before timing stops (at least one).


def peer_device(torch) -> str:
  """PyTorch runs where JAX runs: "cuda" when JAX's default backend is a GPU, else "cpu"."""
  return "cuda" if jax.default_backend() == "gpu" and torch.cuda.is_available() else "cpu"


def prepare_peer(dtype: str, autocast: bool = False) -> tuple[dict, Callable[[], None]] | None:
  """transformers' Llama at the small_decllm shapes, AdamW, PyTorch's own threads; ``autocast``:
  f32 weights with bf16 autocast instead of the model cast to ``dtype``. Returns the row's
  description and one training step (already run once), or None without torch."""
  try:
    import torch
    import transformers
  except ImportError:
    return None
  cfg = small_config("decllm")
  m, b, s = cfg.model, cfg.train.batch_size, cfg.data.sequence_length
  torch.manual_seed(0)
  config = transformers.LlamaConfig(
      vocab_size=m.vocab_size, hidden_size=m.d_model, intermediate_size=m.d_ff,
      num_hidden_layers=m.num_layers, num_attention_heads=m.num_heads,
      num_key_value_heads=m.num_heads, head_dim=m.head_dim, max_position_embeddings=s,
      tie_word_embeddings=True)
  torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
  device = peer_device(torch)
  model = transformers.LlamaForCausalLM(config)
  model = (model if autocast else model.to(torch_dtype)).to(device).train()
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
  ids = torch.randint(2, m.vocab_size, (b, s), device=device)

  def step():
    with torch.autocast(device, dtype=torch_dtype, enabled=autocast):
      loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if device == "cuda":
      torch.cuda.synchronize()
  compile_s = timing.seconds(step)
  name = "transformers Llama (PyTorch, AdamW" + (", autocast, f32 weights)" if autocast else ")")
  return {"config": name, "family": "decllm",
          "params_m": sum(p.numel() for p in model.parameters()) / 1e6, "dtype": dtype,
          "shape": f"{b}x{s}", "tokens": b * s, "flops": flops.train_flops(m, b, s, 0),
          "compile_s": compile_s}, step


def measure_peer(dtype: str, steps: int, autocast: bool = False) -> dict | None:
  """``prepare_peer``'s step timed ``steps`` times, stopping early past ``PEER_BUDGET_S``
  (bf16 without bf16 instructions: ~80 s a step, 15 minutes for the default 10 steps)."""
  prepared = prepare_peer(dtype, autocast)
  if prepared is None:
    return None
  meta, step = prepared
  times = []
  for _ in range(steps):
    times.append(timing.seconds(step))
    if sum(times) + meta["compile_s"] > PEER_BUDGET_S:
      break
  if len(times) < steps:
    meta = {**meta, "config": meta["config"] + f" [{len(times)} steps]"}
  return finish(meta, times)


def compile_scaling() -> list[tuple[int, float]]:
  """Compile seconds of the scanned small DecLLM train step at 4 and 32 layers."""
  out = []
  for layers in (4, 32):
    cfg = small_config("decllm")
    cfg.model.num_layers = layers
    mesh = partitioning.make_mesh(cfg.mesh)
    setup = state_lib.build_setup(cfg, mesh)
    from t5like.training import aot
    batch = aot.abstract_batch(cfg, setup.batch_sharding, cfg.train.batch_size)
    lowered = step_lib.make_train_step(setup).lower(setup.abstract_state, batch)
    out.append((layers, timing.seconds(lowered.compile)))
  return out


def prepare(name: str, cfg: Config) -> tuple[dict, Callable[[], None]]:
  """The row's description and one jitted train step of ``cfg`` (compiled and run once; the
  state is donated step to step, two synthetic batches alternate)."""
  mesh = partitioning.make_mesh(cfg.mesh)
  setup = state_lib.build_setup(cfg, mesh)
  it = SyntheticData(cfg).train(cfg.train.batch_size, 0, 1)
  batches = [global_batch(next(it), setup.batch_sharding, cfg.train.batch_size)
             for _ in range(2)]
  train_step = step_lib.make_train_step(setup)
  held = {"state": state_lib.init_state(setup), "steps": 0}

  def step():
    held["state"], metrics = train_step(held["state"], batches[held["steps"] % 2])
    jax.block_until_ready((held["state"], metrics))
    held["steps"] += 1
  compile_s = timing.seconds(step)
  dec, enc = flops.batch_lengths(batches[0])
  b = cfg.train.batch_size
  return {"config": name, "family": cfg.model.family, "params_m": setup.num_params / 1e6,
          "dtype": cfg.model.dtype, "shape": f"{b}x{enc}+{dec}" if enc else f"{b}x{dec}",
          "tokens": b * (dec + enc), "flops": flops.train_flops(cfg.model, b, dec, enc),
          "compile_s": compile_s}, step


def finish(meta: dict, times: list[float]) -> dict:
  """A table row from ``prepare``'s description and the step times (their median)."""
  dt = statistics.median(times)
  return {**meta, "step_ms": dt * 1e3, "tokens_s": meta["tokens"] / dt,
          "gflops": meta["flops"] / dt / 1e9,
          "mfu": float("nan")}  # MFU: ``with_mfu``, once all rows ran.


def measure(name: str, cfg: Config, steps: int) -> dict:
  meta, step = prepare(name, cfg)
  return finish(meta, [timing.seconds(step) for _ in range(steps)])


def alternate(systems: list[tuple[dict, Callable[[], None]]], rounds: int) -> list[dict]:
  """Rows of ``systems`` timed in ``rounds`` rounds of one step each (after ``PAUSE_S`` and
  ``WARM_STEPS`` untimed steps), the order reversed every other round: on a shared host they
  then see the same machine, not the machine minutes apart (a row measured alone moved 10-30 %
  between runs; docs/performance.md)."""
  def settle(i: int) -> None:
    time.sleep(PAUSE_S)
    for _ in range(WARM_STEPS):
      systems[i][1]()
  times = timing.alternating([step for _, step in systems], rounds, before=settle)
  return [finish(meta, t) for (meta, _), t in zip(systems, times)]


def refresh_peak(configured: float, dtype: str) -> None:
  """On CPU, probes the matmul peak again (the best probe of the run is kept:
  ``flops.measured_cpu_peak``), so one probe in a slow stretch of a shared host does not set
  every row's MFU."""
  if not configured and jax.default_backend() == "cpu":
    flops.measured_cpu_peak(dtype, min_seconds=0.5, refresh=True)


def with_mfu(rows: list[dict], configured: float) -> list[dict]:
  """Each t5like row's MFU against the run's peak for its dtype (``--peak`` if given)."""
  out = []
  for r in rows:
    if not r["config"].startswith("transformers"):
      peak = configured or flops.peak_flops_per_device(0.0, r["dtype"]) * jax.device_count()
      r = {**r, "mfu": r["gflops"] * 1e9 / peak if peak else float("nan")}
    out.append(r)
  return out


def _parse_args() -> argparse.Namespace:
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--steps", type=int, default=10)
  ap.add_argument("--only", default="", help="comma-separated subset of " + ",".join(CONFIGS))
  timing.add_dtype_flag(ap, "float32,bfloat16", several=True)
  ap.add_argument("--peak", type=float, default=0.0,
                  help="peak FLOP/s of the whole mesh (default: CPU matmul probe / device kind)")
  ap.add_argument("--peer", action="store_true",
                  help="also train transformers' Llama on PyTorch at the small_decllm shapes")
  ap.add_argument("--alternate", action="store_true",
                  help="prepare every row first, then time them in alternating rounds (one "
                       "step each, --steps rounds): same-run ratios on a drifting host")
  ap.add_argument("--compile_scaling", action="store_true",
                  help="compile time of a scanned 32-layer vs 4-layer small DecLLM")
  return ap.parse_args()


def _measure_rows(args) -> list[dict]:
  """One row per (config, dtype), and per peer dtype with --peer: measured one after the other,
  or with --alternate prepared first and timed in alternating rounds."""
  names = [n for n in (args.only.split(",") if args.only else CONFIGS) if n]
  rows, systems = [], []
  for name in names:
    for dtype in ([FIXED_DTYPE[name]] if name in FIXED_DTYPE else args.dtype.split(",")):
      cfg = CONFIGS[name]()
      cfg.model.dtype = dtype
      cfg.validate()
      if args.alternate:
        systems.append(prepare(name, cfg))
        continue
      rows.append(measure(name, cfg, min(args.steps, 3) if name in FIXED_DTYPE else args.steps))
      refresh_peak(args.peak, dtype)
      print(f"  measured {name} {dtype}: {rows[-1]['step_ms']:.0f} ms, "
            f"{rows[-1]['tokens_s']:,.0f} tokens/s", file=sys.stderr, flush=True)
  if args.peer:
    for dtype, autocast in [(d, a) for d in args.dtype.split(",")
                            for a in ((False, True) if d != "float32" else (False,))]:
      if args.alternate:
        peer = prepare_peer(dtype, autocast)
        if peer is not None:
          systems.append(peer)
      else:
        peer = measure_peer(dtype, args.steps, autocast)
        if peer is not None:
          rows.append(peer)
          print(f"  measured {peer['config']} {dtype}: {peer['step_ms']:.0f} ms, "
                f"{peer['tokens_s']:,.0f} tokens/s", file=sys.stderr, flush=True)
      if peer is None:
        print("--peer: torch / transformers not installed; no peer rows", file=sys.stderr)
        break
  if args.alternate:
    for dtype in args.dtype.split(","):  # A probe before and after: the best is kept.
      refresh_peak(args.peak, dtype)
    rows = alternate(systems, args.steps)
    for dtype in args.dtype.split(","):
      refresh_peak(args.peak, dtype)
  return with_mfu(rows, args.peak)


def _print_table(rows: list[dict], args) -> None:
  peak = args.peak or flops.peak_flops_per_device(0.0, "float32") * jax.device_count()
  print(f"\ndevice: {jax.devices()[0].device_kind} x {jax.device_count()}; "
        f"FLOPs: docs/flops.md convention; median of {args.steps} steps"
        f"{', alternating rounds' if args.alternate else ' (medium: 3)'}; "
        f"f32 matmul peak measured here {peak / 1e9:.0f} GFLOP/s"
        "\n")
  head = ("config", "family", "params (M)", "dtype", "batch x len", "step ms", "tokens/s",
          "GFLOP/s", "MFU", "compile s")
  print("| " + " | ".join(head) + " |")
  print("|" + "|".join("---" for _ in head) + "|")
  for r in rows:
    mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] == r["mfu"] else "-"  # NaN: the peer's rows.
    print(f"| {r['config']} | {r['family']} | {r['params_m']:.2f} | {r['dtype']} | {r['shape']} "
          f"| {r['step_ms']:.0f} | {r['tokens_s']:,.0f} | {r['gflops']:.0f} | {mfu} "
          f"| {r['compile_s']:.1f} |")


def _print_peer_ratios(rows: list[dict]) -> None:
  """small_decllm's tokens/s over transformers': best against best, then dtype by dtype."""
  peer_rows = [r for r in rows if r["config"].startswith("transformers")]
  ours = [r for r in rows if r["config"].startswith("small_decllm")]
  if not peer_rows or not ours:
    return
  peers = {r["dtype"]: r for r in peer_rows if "autocast" not in r["config"]}
  mixed = {r["dtype"]: r for r in peer_rows if "autocast" in r["config"]}
  best_peer = max(peer_rows, key=lambda r: r["tokens_s"])
  best = max(ours, key=lambda r: r["tokens_s"])
  print(f"\n{best['config']} best ({best['dtype']}) / transformers best "
        f"({best_peer['dtype']}{' autocast' if 'autocast' in best_peer['config'] else ''}): "
        f"{best['tokens_s'] / best_peer['tokens_s']:.2f}x")
  for r in ours:
    if r["dtype"] in peers:
      print(f"{r['config']} {r['dtype']} / transformers {r['dtype']}: "
            f"{r['tokens_s'] / peers[r['dtype']]['tokens_s']:.2f}x")
    if r["dtype"] in mixed:
      print(f"{r['config']} {r['dtype']} / transformers {r['dtype']} autocast (same "
            f"precision): {r['tokens_s'] / mixed[r['dtype']]['tokens_s']:.2f}x")


def main() -> None:
  args = _parse_args()
  rows = _measure_rows(args)
  _print_table(rows, args)
  _print_peer_ratios(rows)
  if args.compile_scaling:
    (l4, c4), (l32, c32) = compile_scaling()
    print(f"\ncompile of the scanned small DecLLM step: {l4} layers {c4:.1f} s, {l32} layers "
          f"{c32:.1f} s ({c32 / c4:.2f}x)")


if __name__ == "__main__":
  main()
