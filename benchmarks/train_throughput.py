#!/usr/bin/env python
"""Train-step throughput and MFU of tiny and small DecLLM / RedLLM configs on this machine.

  python benchmarks/train_throughput.py [--steps 10] [--only tiny_decllm,small_redllm]
                                        [--dtypes float32,bfloat16] [--peak 5.69e11]

Times the jitted train step (forward, backward, clipping, Adafactor; synthetic batches already on
device, so the data pipeline is not measured) and prints one table: tokens/s counts every input
position (encoder + decoder), model FLOPs follow docs/flops.md (t5like.training.flops), MFU is
against the device peak (default: the CPU table of docs/performance.md, f32 569 / bf16 1026 GFLOP/s for
the machine). Median over ``--steps`` steps after one warm-up (compilation) step.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402

from t5like import partitioning  # noqa: E402
from t5like.config import Config, ModelConfig  # noqa: E402
from t5like.training import flops, presets  # noqa: E402
from t5like.training import state as state_lib  # noqa: E402
from t5like.training import step as step_lib  # noqa: E402
from t5like.training.data import SyntheticData, global_batch  # noqa: E402


def small_config(family: str) -> Config:
  """The comparison shape of docs/performance.md: d512, 8 x 64 heads, SwiGLU 1408, vocab 8192; DecLLM L4 at
  S256, RedLLM 2+2 layers at 128 input + 128 target."""
  cfg = Config()
  cfg.model = ModelConfig(family=family, vocab_size=8192, d_model=512, num_heads=8, head_dim=64,
                          d_ff=1408, num_layers=4, num_encoder_layers=2, num_decoder_layers=2,
                          attn_out_norm=family == "redllm")
  cfg.data.sequence_length, cfg.data.inputs_length, cfg.data.targets_length = 256, 128, 128
  cfg.train.batch_size, cfg.train.warmup_steps, cfg.train.steps = 8, 10, 1000
  return cfg


CONFIGS = {
    "tiny_decllm": lambda: presets.tiny_pretraining("decllm"),
    "tiny_redllm": lambda: presets.tiny_pretraining("redllm"),
    "small_decllm": lambda: small_config("decllm"),
    "small_redllm": lambda: small_config("redllm"),
}


def measure(name: str, cfg: Config, steps: int, peak: float) -> dict:
  mesh = partitioning.make_mesh(cfg.mesh)
  setup = state_lib.build_setup(cfg, mesh)
  state = state_lib.init_state(setup)
  it = SyntheticData(cfg).train(cfg.train.batch_size, 0, 1)
  batches = [global_batch(next(it), setup.batch_sharding, cfg.train.batch_size)
             for _ in range(2)]
  train_step = step_lib.make_train_step(setup)
  t0 = time.perf_counter()
  state, metrics = train_step(state, batches[0])
  jax.block_until_ready(metrics)
  compile_s = time.perf_counter() - t0
  times = []
  for i in range(steps):
    t = time.perf_counter()
    state, metrics = train_step(state, batches[i % 2])
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - t)
  dt = statistics.median(times)
  dec, enc = flops.batch_lengths(batches[0])
  b = cfg.train.batch_size
  f = flops.train_flops(cfg.model, b, dec, enc)
  peak = peak or flops.peak_flops_per_device(0.0, cfg.model.dtype) * mesh.size
  return {"config": name, "family": cfg.model.family, "params_m": setup.num_params / 1e6,
          "dtype": cfg.model.dtype, "shape": f"{b}x{enc}+{dec}" if enc else f"{b}x{dec}",
          "step_ms": dt * 1e3, "tokens_s": b * (dec + enc) / dt, "gflops": f / dt / 1e9,
          "mfu": f / dt / peak, "compile_s": compile_s}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--steps", type=int, default=10)
  ap.add_argument("--only", default="", help="comma-separated subset of " + ",".join(CONFIGS))
  ap.add_argument("--dtypes", default="float32,bfloat16")
  ap.add_argument("--peak", type=float, default=0.0,
                  help="peak FLOP/s of the whole mesh (default: device-kind lookup)")
  args = ap.parse_args()
  names = [n for n in (args.only.split(",") if args.only else CONFIGS) if n]
  rows = []
  for name in names:
    for dtype in args.dtypes.split(","):
      cfg = CONFIGS[name]()
      cfg.model.dtype = dtype
      cfg.validate()
      rows.append(measure(name, cfg, args.steps, args.peak))
      print(f"  measured {name} {dtype}", file=sys.stderr, flush=True)
  print(f"\ndevice: {jax.devices()[0].device_kind} x {jax.device_count()}; "
        f"FLOPs: docs/flops.md convention; median of {args.steps} steps\n")
  head = ("config", "family", "params (M)", "dtype", "batch x len", "step ms", "tokens/s",
          "GFLOP/s", "MFU", "compile s")
  print("| " + " | ".join(head) + " |")
  print("|" + "|".join("---" for _ in head) + "|")
  for r in rows:
    print(f"| {r['config']} | {r['family']} | {r['params_m']:.2f} | {r['dtype']} | {r['shape']} "
          f"| {r['step_ms']:.0f} | {r['tokens_s']:,.0f} | {r['gflops']:.0f} | "
          f"{100 * r['mfu']:.1f}% | {r['compile_s']:.1f} |")


if __name__ == "__main__":
  main()
