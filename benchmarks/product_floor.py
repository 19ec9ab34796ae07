#!/usr/bin/env python
"""The train step's matrix products, each alone, on XLA:CPU and on PyTorch, next to both whole
steps, in one run: how much of the gap to PyTorch is the product library's speed.

  python benchmarks/product_floor.py [--config small_decllm_unrolled] [--dtype float32]
                                     [--repeats 7]

Lists every 2-D product of the step from the model config (per layer: the attention
projections, SwiGLU's gate, up and down; the logits), each as its forward ``x @ W``, its input
gradient ``g @ W^T`` and its weight gradient ``x^T @ g`` (the attention core runs in its own
kernel and is not listed). Each product is jitted alone as a plain expression (XLA:CPU picks its
form; the step's own forms, e.g. ``layers._cpu_nt_matmul`` for the logits, can differ) and,
where torch is installed (never a dependency of this project), run as the same ``torch``
expression, which on Intel CPUs calls MKL. Float32 is the comparison this is for (bf16 products
give float32 results on XLA's side, as in the step, and bf16 on PyTorch's). Rounds alternate
the two systems product by product and time both whole train steps (``train_throughput.py``'s
``prepare`` and ``prepare_peer``; the peer only at the ``small_decllm`` shapes) in the same
rounds, so every number saw the same host.

Prints per product the GFLOP/s of each side and its milliseconds per step (median over rounds),
then the steps, "the rest" (step minus its products alone) and what the t5like step would take
with every product at PyTorch's speed: what the product library's speed alone is worth. Inside
a fused step two products often run side by side, so the sums overstate the products' share of
the step (``step_trace.py`` gives the in-step share); compare them side to side, as printed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # A checkout.

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import timing  # noqa: E402
from benchmarks import train_throughput as tt  # noqa: E402
from t5like import runtime  # noqa: E402
from t5like.config import ModelConfig  # noqa: E402

TARGET = 1.2  # Issue #13: t5like's step at 1.2x PyTorch's tokens/s.


@dataclass(frozen=True)
class Product:
  name: str     # Which weights.
  role: str     # "fwd" (x @ W), "dx" (g @ W^T) or "dW" (x^T @ g).
  form: str     # "nn": a [M, K] @ b [K, N]; "nt": a [M, K] @ b[N, K]^T; "tn": a[K, M]^T @ b [K, N].
  m: int
  k: int
  n: int
  count: int    # How many run per step.

  @property
  def flops(self) -> int:
    return 2 * self.m * self.k * self.n


def _three(name: str, tokens: int, d_in: int, d_out: int, count: int) -> list[Product]:
  """A weight [d_in, d_out] applied to ``tokens`` rows: forward, input and weight gradients."""
  return [Product(name, "fwd", "nn", tokens, d_in, d_out, count),
          Product(name, "dx", "nt", tokens, d_out, d_in, count),
          Product(name, "dW", "tn", d_in, tokens, d_out, count)]


def step_products(m: ModelConfig, batch: int, dec_len: int, enc_len: int) -> list[Product]:
  """The products of one train step of ``m`` (``enc_len`` 0: decoder-only), equal shapes merged."""
  d, q, kv = m.d_model, m.num_heads * m.head_dim, m.kv_heads * m.head_dim
  td, te = batch * dec_len, batch * enc_len
  dec_layers = m.num_decoder_layers if m.family == "redllm" else m.num_layers
  weights = [("attention", td, d, q, dec_layers), ("attention", td, d, kv, 2 * dec_layers),
             ("attention", td, q, d, dec_layers), ("gate, up", td, d, m.d_ff, 2 * dec_layers),
             ("down", td, m.d_ff, d, dec_layers), ("logits", td, d, m.vocab_size, 1)]
  if m.family == "redllm":
    el = m.num_encoder_layers
    weights += [("encoder attention", te, d, q, el), ("encoder attention", te, d, kv, 2 * el),
                ("encoder attention", te, q, d, el), ("encoder gate, up", te, d, m.d_ff, 2 * el),
                ("encoder down", te, m.d_ff, d, el), ("cross-attention", td, d, q, dec_layers),
                ("cross-attention", te, d, kv, 2 * dec_layers),
                ("cross-attention", td, q, d, dec_layers)]
  products: dict[tuple, Product] = {}
  for name, tokens, d_in, d_out, count in weights:
    for p in _three(name, tokens, d_in, d_out, count):
      key = (p.form, p.m, p.k, p.n)
      old = products.get(key)
      if old is not None:
        name = old.name if p.name in old.name.split("; ") else f"{old.name}; {p.name}"
        p = Product(name, p.role, p.form, p.m, p.k, p.n, old.count + p.count)
      products[key] = p
  return list(products.values())


def _operands(p: Product) -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(0)
  shapes = {"nn": ((p.m, p.k), (p.k, p.n)), "nt": ((p.m, p.k), (p.n, p.k)),
            "tn": ((p.k, p.m), (p.k, p.n))}[p.form]
  return tuple(rng.standard_normal(s, np.float32) for s in shapes)


_OPERANDS = {"nn": lambda a, b: (a, b), "nt": lambda a, b: (a, b.T), "tn": lambda a, b: (a.T, b)}


def _xla(form: str):
  """The product as the step computes it: float32 accumulation for bf16 operands too."""
  return jax.jit(lambda a, b: jnp.matmul(*_OPERANDS[form](a, b),
                                         preferred_element_type=jnp.float32))


def product_runners(p: Product, dtype: str) -> dict:
  """One call of ``p`` per system (each already run once): "xla", and "torch" when installed."""
  a, b = _operands(p)
  ja, jb = jnp.asarray(a, dtype), jnp.asarray(b, dtype)
  f = _xla(p.form)
  f(ja, jb).block_until_ready()
  runners = {"xla": lambda: f(ja, jb).block_until_ready()}
  try:
    import torch
  except ImportError:
    return runners
  ta, tb = _OPERANDS[p.form](*(torch.from_numpy(x).to(getattr(torch, dtype)) for x in (a, b)))
  torch.matmul(ta, tb)
  runners["torch"] = lambda: torch.matmul(ta, tb)
  return runners


def measure(args) -> tuple[list[Product], list[dict], dict]:
  """Median seconds per call of every product and of both steps, over alternating rounds."""
  cfg = tt.CONFIGS[args.config]()
  cfg.model.dtype = args.dtype
  cfg.validate()
  enc = cfg.data.inputs_length if cfg.model.family == "redllm" else 0
  dec = cfg.data.targets_length if enc else cfg.data.sequence_length
  products = step_products(cfg.model, cfg.train.batch_size, dec, enc)
  runners = [product_runners(p, args.dtype) for p in products]
  steps = {"t5like": tt.prepare(args.config, cfg)[1]}
  if args.config.startswith("small_decllm"):  # The peer's shapes (``prepare_peer``).
    peer = tt.prepare_peer(args.dtype)
    if peer is not None:
      steps["transformers"] = peer[1]
  prod_t = [{s: [] for s in r} for r in runners]
  step_t = {s: [] for s in steps}
  for r in range(args.repeats):
    order = (lambda xs: xs) if r % 2 == 0 else (lambda xs: list(reversed(xs)))
    for name in order(list(steps)):
      time.sleep(tt.PAUSE_S)
      steps[name]()  # Untimed: the system's buffers back in cache (train_throughput.py).
      step_t[name].append(timing.seconds(steps[name]))
    for runner, times in zip(runners, prod_t):
      for name in order(list(runner)):
        runner[name]()
        times[name].append(timing.seconds(runner[name]))
  med = statistics.median
  return (products, [{s: med(t) for s, t in times.items()} for times in prod_t],
          {s: med(t) for s, t in step_t.items()})


def report(products: list[Product], prod_s: list[dict], step_s: dict) -> None:
  systems = [s for s in ("xla", "torch") if s in prod_s[0]]
  print("| weights | product | M x K x N | per step | "
        + " | ".join(f"{s} GFLOP/s" for s in systems) + " | "
        + " | ".join(f"{s} ms/step" for s in systems) + " |")
  print("|" + "|".join("---" for _ in range(4 + 2 * len(systems))) + "|")
  total = {s: 0.0 for s in systems}
  for p, sec in zip(products, prod_s):
    for s in systems:
      total[s] += sec[s] * p.count
    print(f"| {p.name} | {p.role} ({p.form}) | {p.m} x {p.k} x {p.n} | {p.count} | "
          + " | ".join(f"{p.flops / sec[s] / 1e9:.0f}" for s in systems) + " | "
          + " | ".join(f"{1e3 * sec[s] * p.count:.1f}" for s in systems) + " |")
  flops = sum(p.flops * p.count for p in products)
  print("| all products | | | | " + " | ".join(f"{flops / total[s] / 1e9:.0f}" for s in systems)
        + " | " + " | ".join(f"**{1e3 * total[s]:.0f}**" for s in systems) + " |")
  ours = step_s["t5like"]
  print(f"\nt5like step {1e3 * ours:.0f} ms: its products alone {1e3 * total['xla']:.0f}, "
        f"the rest {1e3 * (ours - total['xla']):.0f}")
  if "transformers" not in step_s or "torch" not in total:
    return
  peer = step_s["transformers"]
  floor = ours - total["xla"] + total["torch"]
  print(f"transformers step {1e3 * peer:.0f} ms: its products alone (same expressions) "
        f"{1e3 * total['torch']:.0f}, the rest {1e3 * (peer - total['torch']):.0f}")
  print(f"t5like / transformers today: {peer / ours:.2f}x; with every product at PyTorch's "
        f"speed: {peer / floor:.2f}x ({1e3 * floor:.0f} ms)")
  print(f"{TARGET}x needs a step of {1e3 * peer / TARGET:.0f} ms: the rest at "
        f"{1e3 * (peer / TARGET - total['xla']):.0f} ms with XLA's products "
        f"(today {1e3 * (ours - total['xla']):.0f}), at "
        f"{1e3 * (peer / TARGET - total['torch']):.0f} ms with PyTorch's")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--config", default="small_decllm_unrolled", choices=sorted(tt.CONFIGS))
  timing.add_dtype_flag(ap, "float32", choices=("float32", "bfloat16"))
  timing.add_repeats_flag(ap, 7, "alternating rounds")
  args = ap.parse_args()
  print(f"device: {jax.devices()[0].device_kind}; {args.config} {args.dtype}; median of "
        f"{args.repeats} alternating rounds; {runtime.huge_pages_state()}\n")
  report(*measure(args))


if __name__ == "__main__":
  main()
