#!/usr/bin/env python
"""The grouped products of one MoE layer of configs/*_1b_moe.py on one device: does the dropless
path (``jax.lax.ragged_dot``, what models/moe.py runs) cost the products of the tokens' own
experts, or a dense product over every expert? Beside it the same FLOPs as one plain GEMM (the
yardstick), the capacity path's batched product over fixed expert buffers, and, on Hopper, the
grouped GEMM JAX ships as a Pallas Mosaic GPU kernel
(``jax.experimental.pallas.ops.gpu.ragged_dot_mgpu``, forward only).

  python benchmarks/gpu_ragged.py [--tokens 16384] [--repeats 5] [--json out.json] [--smoke]

Shapes: ``tokens`` x top-7 (token, expert) rows sorted by expert, d_model 2048 -> expert width
1024 (the gate product), 64 experts, bf16, group sizes of a random routing. Each row: ms of the
forward product (and of forward + backward for the JAX paths), TFLOP/s counted on ``2 M K N``
(M the routed rows), the compiled program's temporary bytes (a dense rewrite shows as
``G x M x K`` of them) and whether XLA kept a ``ragged-dot`` instruction. Run it under the flag
variants (``gpu_flags.py --bench benchmarks/gpu_ragged.py --variants default,ragged_dot_cudnn``)
to see XLA:GPU's cuDNN ragged-dot fusion and JAX's Pallas Triton lowering where they exist.
"""
from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # A checkout.

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import timing  # noqa: E402
from t5like.config.moe import paper_moe  # noqa: E402


def group_sizes(tokens: int, experts: int, top_k: int, seed: int = 0) -> np.ndarray:
  """Rows per expert of a random top-k routing (each token ``top_k`` distinct experts)."""
  rng = np.random.default_rng(seed)
  picks = np.argsort(rng.random((tokens, experts)), axis=1)[:, :top_k]
  return np.bincount(picks.ravel(), minlength=experts).astype(np.int32)


def _measure(fn, args, repeats: int) -> dict:
  compiled = jax.jit(fn).lower(*args).compile()
  mem = compiled.memory_analysis()
  call = lambda: jax.block_until_ready(compiled(*args))  # noqa: E731
  return {"ms": timing.median_seconds(call, repeats) * 1e3,
          "temp_gib": getattr(mem, "temp_size_in_bytes", 0) / 2 ** 30,
          "ragged_dot_kept": "ragged-dot(" in compiled.as_text()}


def rows(tokens: int, d_model: int, width: int, experts: int, top_k: int, dtype,
         repeats: int, capacity_factor: float = 1.25) -> list[dict]:
  sizes = group_sizes(tokens, experts, top_k)
  m = int(sizes.sum())
  k1, k2 = jax.random.split(jax.random.key(0))
  x = jax.random.normal(k1, (m, d_model), jnp.float32).astype(dtype)
  w = (jax.random.normal(k2, (experts, d_model, width), jnp.float32) / 45).astype(dtype)
  gs = jnp.asarray(sizes)
  flop = 2.0 * m * d_model * width
  cap = math.ceil(capacity_factor * m / experts)
  xc = jnp.zeros((experts, cap, d_model), dtype)
  ragged = lambda x, w, gs: jax.lax.ragged_dot(x, w, gs)  # noqa: E731
  grad = jax.grad(lambda x, w, gs: jnp.sum(ragged(x, w, gs).astype(jnp.float32)), (0, 1))
  cases = [
      ("dense GEMM, same FLOPs", lambda x, w: x @ w[0], (x, w), flop),
      ("ragged_dot forward", ragged, (x, w, gs), flop),
      ("ragged_dot forward+backward", grad, (x, w, gs), 3 * flop),
      (f"capacity {capacity_factor} batched einsum forward",
       lambda xc, w: jnp.einsum("gcd,gdf->gcf", xc, w), (xc, w), 2.0 * experts * cap * d_model
       * width),
  ]
  dev = jax.devices()[0]
  if dev.platform == "gpu":
    try:
      from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu
      kernel = functools.partial(ragged_dot_mgpu.ragged_dot, block_m=128, block_n=128,
                                 block_k=64, max_concurrent_steps=4, grid_block_n=1)
      cases.append(("pallas mosaic-gpu ragged_dot forward",
                    lambda x, w, gs: kernel(x, w, group_sizes=gs), (x, w, gs), flop))
    except ImportError as e:
      print(f"  no ragged_dot_mgpu: {e}", flush=True)
  out = []
  for name, fn, args, f in cases:
    row = {"row": f"moe products: {name}", "m": m, "k": d_model, "n": width, "groups": experts,
           "flops": f}
    try:
      row.update(_measure(fn, args, repeats))
      row["tflops_s"] = f / row["ms"] * 1e-9
    except Exception as e:  # noqa: BLE001 -- a path this JAX / card lacks is a row, not a stop.
      row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    print(f"  {row}", flush=True)
    out.append(row)
  return out


def main(argv=None) -> list[dict]:
  from benchmarks import gpu_train
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--tokens", type=int, default=16384, help="tokens (8 rows x 2048)")
  ap.add_argument("--repeats", type=int, default=5, help="timed calls per product (median)")
  ap.add_argument("--json", default="", help="also write the rows to this JSON file")
  ap.add_argument("--smoke", action="store_true", help="tiny shapes (any device), for tests")
  args = ap.parse_args(argv)
  dev = jax.devices()[0]
  moe = paper_moe(8192)
  print(f"device: {dev.device_kind} ({dev.platform}); JAX {jax.__version__}; "
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}", flush=True)
  start = time.time()
  if args.smoke:
    out = rows(64, 32, 16, 8, 3, jnp.float32, 1)
  else:
    out = rows(args.tokens, 2048, moe.expert_d_ff, moe.num_experts, moe.top_k,
               jnp.bfloat16 if dev.platform == "gpu" else jnp.float32, args.repeats)
  if args.json:
    gpu_train.save_rows(args.json, dev, out)
  print(f"total {time.time() - start:.0f} s", flush=True)
  return out


if __name__ == "__main__":
  main()
