#!/usr/bin/env python
"""The decode step with its dense kernels in the training layout against ``TransposedKernel``s.

  python benchmarks/decode_layout.py [--cases 1x128+64,8x128+64] [--repeats 7]

A decode step multiplies one token per row by every weight: a few-row product that reads each
weight once per token, so its speed is the speed at which the weights stream from memory. On
XLA:CPU a row-major ``[out, in]`` kernel as the left (streamed) operand of the product is read
faster than the training layout ``[in, out]`` on the right; ``generate`` therefore copies the
kernels transposed once per call on CPU and multiplies the embedding table (already
``[vocab, embed]``) the same way for the logits (``t5like.inference.steps.decode_weights``).
This benchmark times the same jitted decode loop (prefill outside the timing, ``new`` one-token
steps) with either layout for the small DecLLM and RedLLM of ``decode_throughput.py``,
alternating the two in one process, and prints the median milliseconds per step (a call of
``new`` steps minus a call of none) and of the whole call (prefill, the per-call weight copies,
the steps) with their ratios.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # A checkout.

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from benchmarks import timing  # noqa: E402
from benchmarks.decode_throughput import parse_case, small_model_config  # noqa: E402
from t5like.inference import generation as gen  # noqa: E402
from t5like.inference import steps  # noqa: E402
from t5like.models import build_model  # noqa: E402


def decode_loop(family: str, batch: int, prompt: int, new: int, transpose: bool):
  """A jitted fn(params, tokens, lens, n) running the prefill, then ``n`` greedy decode steps
  over weights prepared with (or without) transposed kernels; returns the last tokens."""
  cfg = small_model_config(family, "float32")
  model = build_model(cfg, nnx.Rngs(0))
  graphdef, params = nnx.graphdef(model), nnx.to_pure_dict(nnx.state(model))
  rng = np.random.RandomState(0)
  prompts = [rng.randint(2, cfg.vocab_size, size=prompt).tolist() for _ in range(batch)]
  tokens, lens = gen._pad_inputs(prompts, family, batch)
  p = tokens.shape[1]

  def run(params, tokens_bp, lens_b, n):
    mdl = nnx.merge(graphdef, params)
    weights = steps.decode_weights(mdl, transpose=transpose)
    if family == "decllm":
      start_b = p - lens_b
      idx = jnp.arange(p)[None, :]
      seg = (idx >= start_b[:, None]).astype(jnp.int32)
      pos = jnp.maximum(idx - start_b[:, None], 0).astype(jnp.int32)
      logits, cache = steps.decllm_prefill(mdl, tokens_bp, seg, pos, p + new)
      step = lambda y, t, c: steps.decllm_decode(mdl, weights, y, lens_b + t, p + t, c)  # noqa
    else:
      cross, cache = steps.redllm_prefill(mdl, tokens_bp, new + 1)
      logits = jnp.zeros((batch, cfg.vocab_size))  # First decoder input: BOS (argmax 0).
      step = lambda y, t, c: steps.redllm_decode(mdl, weights, y, cross.enc_len_b + t, t, c,  # noqa
                                                 cross)

    def body(t, state):
      y_b, cache = state
      logits, cache = step(y_b, t, cache)
      return jnp.argmax(logits, -1).astype(jnp.int32), cache

    y_b = jnp.argmax(logits, -1).astype(jnp.int32)
    return jax.lax.fori_loop(0, n, body, (y_b, cache))[0]

  fn = jax.jit(run, static_argnums=3)
  return lambda n: jax.block_until_ready(fn(params, jnp.asarray(tokens), jnp.asarray(lens), n))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--cases", default="1x128+64,8x128+64")
  timing.add_repeats_flag(parser, 7, "alternating rounds")
  args = parser.parse_args()
  print("| model | batch x prompt + new | ms/step: training layout | transposed | speed-up "
        "| ms/call: training layout | transposed | speed-up |")
  print("|---|---|---|---|---|---|---|---|")
  for case in args.cases.split(","):
    batch, prompt, new = parse_case(case)
    for family in ("decllm", "redllm"):
      fns = {t: decode_loop(family, batch, prompt, new, t) for t in (False, True)}
      for fn in fns.values():  # Compile both step counts.
        fn(0), fn(new)
      ms, call = {t: [] for t in fns}, {t: [] for t in fns}
      for _ in range(args.repeats):
        for t, fn in fns.items():  # Alternating, so drifts of the host hit both alike.
          prefill, whole = timing.seconds(lambda: fn(0)), timing.seconds(lambda: fn(new))
          ms[t].append((whole - prefill) / new * 1e3)
          call[t].append(whole * 1e3)
      a, b = statistics.median(ms[False]), statistics.median(ms[True])
      c, d = statistics.median(call[False]), statistics.median(call[True])
      print(f"| {family} | {case} | {a:.2f} | {b:.2f} | {a / b:.2f}x | {c:.0f} | {d:.0f} | "
            f"{c / d:.2f}x |", flush=True)


if __name__ == "__main__":
  from t5like import runtime
  runtime.reexec_with_huge_pages()  # What the CLIs run with (t5like/runtime.py).
  main()
