#!/usr/bin/env python
"""Greedy decode of ``gpu_train.py``'s models against the HBM-bandwidth floor (the decode rows of
``make bench-gpu``, and on its own the decode A/B of ``gpu_flags.py``).

  python benchmarks/gpu_decode.py [--families decllm,redllm] [--batches 1,8] [--prompt 128]
                                  [--news 16,80] [--repeats 3] [--profile_dir DIR]
                                  [--json out.json] [--smoke]

Per family and batch: ms per token (the difference of two generation lengths, so prefill and
compilation cancel), the floor (the bytes a step reads over the card's HBM bandwidth) and the
share of it reached; the kernels one decode step runs, counted in the compiled program's loop
body (``hlo_kernels``: fusions, library calls and other device ops; ``hlo_launches``: the same
with each command-buffer call counted once, so CUDA graphs show); with ``--profile_dir`` (first
batch of each family) the GPU kernels a token runs and their busy milliseconds in a
``jax.profiler`` trace (difference of the two lengths again; XLA runs op by op under the
profiler, so this is the kernel count without CUDA graphs), whose ratio to ``step_ms`` is the
share of the step the GPU is busy (the rest: launch gaps). ``--smoke``: a tiny model that runs
anywhere (CPU: float32).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # A checkout.

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import timing  # noqa: E402
from benchmarks.gpu_report import gpu_kernel_events, trace_events  # noqa: E402

# HBM bandwidth per device, bytes/s (first match of the lower-cased device kind).
HBM_BANDWIDTH = (("h200", 4.8e12), ("h100 pcie", 2.0e12), ("h100", 3.35e12), ("a100", 2.0e12),
                 ("l4", 0.3e12))
# HLO instructions that run no kernel of their own (views, tuples, constants, control).
NO_KERNEL = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast", "after-all",
             "add-dependency", "opt-barrier", "partition-id", "replica-id", "domain"}
_CROSS_KV = re.compile(r"\['cross_attention'\]\['w[kv]'\]")  # Computed once, at prefill.
_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = .*?\s([a-z][a-z0-9\-_]*)\((.*)$")


def hbm_bandwidth(device_kind: str) -> float:
  kind = device_kind.lower()
  return next((bw for key, bw in HBM_BANDWIDTH if key in kind), 0.0)


def decode_floor_bytes(cfg, params: dict, batch: int, context: float, encoder_length: int = 0
                       ) -> float:
  """Bytes one greedy decode step reads: the weights it uses as the decode layout holds them
  (a bf16 model: its dense kernels and tables at 2 bytes, norms at 4; RedLLM: not the encoder's,
  nor the cross-attention's key/value projections, whose outputs prefill caches), and the KV
  cache: ``context`` cached tokens of the decoder's own (mean over the timed steps) in every
  self-attention layer, RedLLM's ``encoder_length`` encoder keys and values in every
  cross-attention."""
  leaves = [(jax.tree_util.keystr(path), x)
            for path, x in jax.tree_util.tree_flatten_with_path(params)[0]]
  weights = sum(x.size * x.dtype.itemsize for key, x in leaves
                if not key.startswith("['encoder") and not _CROSS_KV.search(key))
  kv = 2 * cfg.kv_heads * cfg.head_dim * np.dtype(cfg.dtype).itemsize * batch
  if cfg.family == "decllm":
    return float(weights + cfg.num_layers * kv * context)
  return float(weights + cfg.num_decoder_layers * kv * (context + encoder_length))


def hlo_computations(text: str) -> dict[str, list[tuple[str, str, str]]]:
  """An optimised HLO module's text as {computation: [(name, opcode, rest of line)]}."""
  comps: dict[str, list] = {}
  current = None
  for line in text.splitlines():
    m = _COMPUTATION.match(line)
    if m:
      current = comps.setdefault(m.group(1), [])
    elif line.startswith("}"):
      current = None
    elif current is not None:
      i = _INSTRUCTION.match(line)
      if i:
        current.append(i.groups())
  return comps


def _called(rest: str, key: str) -> str:
  m = re.search(key + r"=%?([\w.\-]+)", rest)
  return m.group(1) if m else ""


def _count(comps: dict, name: str, out: dict, top: bool) -> None:
  for _, op, rest in comps.get(name, []):
    if op in NO_KERNEL:
      continue
    if op == "call":  # A command buffer (or a wrapper): one launch of all that it calls.
      out["launches"] += top
      _count(comps, _called(rest, "to_apply"), out, False)
      continue
    kind = op
    if op == "fusion":
      kind = "fusion:" + (_called(rest, "kind").lstrip("k") or "?")
    elif op == "custom-call":
      target = re.search(r'custom_call_target="([^"]+)"', rest)
      kind = "custom-call:" + (target.group(1) if target else "?")
    out["kernels"] += 1
    out["launches"] += top
    out["by_kind"][kind] = out["by_kind"].get(kind, 0) + 1


def loop_kernels(hlo_text: str) -> dict:
  """The device ops one iteration of the program's largest while loop runs (body + condition):
  ``kernels`` in all, ``launches`` counting a ``call`` (XLA:GPU's command buffers) once, and
  ``by_kind`` (fusion kinds, custom-call targets, other opcodes). Zeros without a loop."""
  comps = hlo_computations(hlo_text)
  loops = [(_called(rest, "body"), _called(rest, "condition"))
           for instrs in comps.values() for _, op, rest in instrs if op == "while"]
  out = {"kernels": 0, "launches": 0, "by_kind": {}}
  if loops:
    body, cond = max(loops, key=lambda bc: len(comps.get(bc[0], [])))
    for name in (body, cond):
      _count(comps, name, out, True)
  return out


def trace_kernels(events: list[dict]) -> tuple[int, float]:
  """(kernel count, busy milliseconds) of the GPU kernels in a trace's events."""
  kernels = list(gpu_kernel_events(events))
  return len(kernels), sum(float(e.get("dur", 0.0)) for e in kernels) / 1e3


def _decode_call(generator, prompts: list[list[int]], new: int):
  """The compiled generation program for ``prompts`` and ``new`` tokens (eos never), and a
  call of it that blocks: timed and inspected without the Python around ``Generator``."""
  from t5like.inference import generation as gen
  from t5like.inference.sampling import SamplingConfig
  cfg = generator.cfg
  tokens, lens = gen._pad_inputs(prompts, cfg.family, len(prompts))
  plan = gen._Plan(cfg.family, tokens.shape[1], new, -1, SamplingConfig())
  fn = gen._compiled(cfg, generator._graphdef, generator._module_types, plan)
  args = (generator._params, jax.numpy.asarray(tokens), jax.numpy.asarray(lens), None)
  compiled = fn.lower(*args).compile()
  return compiled, lambda: jax.block_until_ready(compiled(*args))


def _profiled_kernels(call, profile_dir: str) -> tuple[int, float]:
  """Kernels and busy ms of one traced ``call`` (its own trace directory)."""
  os.makedirs(profile_dir, exist_ok=True)
  jax.profiler.start_trace(profile_dir)
  call()
  jax.profiler.stop_trace()
  return trace_kernels(trace_events(profile_dir))


def decode_rows(model_cfg, bandwidth: float, batches=(1, 8), prompt: int = 128,
                news=(16, 80), repeats: int = 3, profile_dir: str = "", add=None) -> list[dict]:
  """Rows of greedy decode of ``model_cfg`` (a ModelConfig; random weights, ``prompt``-token
  random prompts) at each batch size: ms per token, the share of the HBM floor it reaches and
  the kernels per step (compiled loop body; with ``profile_dir``, first batch: a trace)."""
  from flax import nnx

  from t5like.inference import generation as gen
  from t5like.models import build_model
  cfg = dataclasses.replace(model_cfg, attention_impl="reference")  # Decoding reads a KV cache.
  family = cfg.family
  generator = gen.Generator(build_model(cfg, nnx.Rngs(0)))
  params = generator._params  # What a decode step reads (the decode layout's dtypes).
  rng = np.random.default_rng(0)
  rows = []
  for i, b in enumerate(batches):
    prompts = [rng.integers(2, cfg.vocab_size, size=prompt).tolist() for _ in range(b)]
    calls, t, compile_s = {}, {}, 0.0
    for n in news:
      start = time.perf_counter()
      compiled, calls[n] = _decode_call(generator, prompts, n)
      compile_s += time.perf_counter() - start
      t[n] = timing.median_seconds(calls[n], repeats)
    kernels = loop_kernels(compiled.as_text())
    step_s = (t[news[1]] - t[news[0]]) / (news[1] - news[0])
    mean_new = (news[0] + news[1]) / 2  # Mean decoder tokens cached over the timed steps.
    context, enc = (prompt + mean_new, 0) if family == "decllm" else (mean_new, prompt)
    floor_bytes = decode_floor_bytes(cfg, params, b, context, enc)
    floor_s = floor_bytes / bandwidth if bandwidth else 0
    row = {"row": f"{family} decode batch {b}", "family_decode": family, "batch": b,
           "step_ms": step_s * 1e3, "floor_ms": floor_s * 1e3, "floor_bytes": floor_bytes,
           "of_floor": floor_s / step_s if floor_s else float("nan"), "tokens_s": b / step_s,
           "compile_s": compile_s, "hlo_kernels": kernels["kernels"],
           "hlo_launches": kernels["launches"], "hlo_by_kind": kernels["by_kind"]}
    if profile_dir and i == 0:
      counts = {n: _profiled_kernels(calls[n], os.path.join(profile_dir, f"{family}_b{b}_{n}"))
                for n in news}
      d = news[1] - news[0]
      row["trace_kernels"] = (counts[news[1]][0] - counts[news[0]][0]) / d
      row["trace_busy_ms"] = (counts[news[1]][1] - counts[news[0]][1]) / d
      row["busy_share"] = row["trace_busy_ms"] / row["step_ms"] if step_s > 0 else float("nan")
    rows.append(row)
    print(f"  {row}", flush=True)
    if add is not None:  # Saved as it comes: a timeout keeps the rows before it.
      add(row)
  return rows


def _args(argv=None) -> argparse.Namespace:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--families", default="decllm,redllm", help="comma list of model families")
  ap.add_argument("--batches", default="1,8", help="comma list of batch sizes")
  ap.add_argument("--prompt", type=int, default=128, help="prompt tokens per row")
  ap.add_argument("--news", default="16,80", help="the two generation lengths (new tokens)")
  ap.add_argument("--repeats", type=int, default=3, help="timed calls per length (median)")
  ap.add_argument("--layers", type=int, default=0, help="layers (RedLLM N+N); 0 = the paper's")
  ap.add_argument("--profile_dir", default="", help="trace each family's first batch here")
  ap.add_argument("--json", default="", help="also write the rows to this JSON file")
  ap.add_argument("--smoke", action="store_true", help="tiny shapes (any device), for tests")
  args = ap.parse_args(argv)
  news = [int(n) for n in args.news.split(",")]
  if len(news) != 2 or not 0 < news[0] < news[1]:
    ap.error(f"--news needs two lengths, the first smaller, e.g. 16,80; got {args.news!r}")
  return args


def main(argv=None) -> list[dict]:
  """Decode rows of each family at the paper's 1B widths (``gpu_train.make_config``)."""
  from benchmarks import gpu_train
  args = _args(argv)
  dev = jax.devices()[0]
  shape = gpu_train.bench_shape(args.smoke, dev.platform == "gpu", layers=args.layers)
  bandwidth = hbm_bandwidth(dev.device_kind)
  print(f"device: {dev.device_kind} ({dev.platform}); JAX {jax.__version__}; HBM "
        f"{bandwidth / 1e12:.2f} TB/s; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}", flush=True)
  sizes = dict(batches=tuple(int(b) for b in args.batches.split(",")), prompt=args.prompt,
               news=tuple(int(n) for n in args.news.split(",")), repeats=args.repeats)
  if args.smoke:
    sizes.update(prompt=8, news=(2, 4), repeats=1)
  rows: list[dict] = []

  def add(row: dict) -> None:
    rows.append(row)
    if args.json:
      gpu_train.save_rows(args.json, dev, rows)
  for family in [f for f in args.families.split(",") if f]:
    model_cfg = gpu_train.make_config(family, shape, "none", 1, False).model
    decode_rows(model_cfg, bandwidth, profile_dir=args.profile_dir, add=add, **sizes)
  return rows


if __name__ == "__main__":
  main()
