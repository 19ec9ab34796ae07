#!/usr/bin/env python
"""KV-cache generation speed of DecLLM and RedLLM at (about) equal parameters, on this machine.

  python benchmarks/decode_throughput.py [--cases 1x128+64,8x128+64,8x512+128] [--repeats 3]
                                         [--dtype float32] [--peer]

Shapes of the small comparison models (docs/performance.md): d512, 8 x 64 heads, SwiGLU 1408,
vocab 8192; DecLLM 4 layers, RedLLM 2 encoder + 2 decoder layers. Each case is
``batch x prompt + new`` tokens, every row generating all ``new`` tokens (no EOS). Columns:

- ``prefill tok/s``: prompt tokens per second of the prefill alone (DecLLM: the decoder over the
  prompt; RedLLM: the encoder and the cross-attention keys/values of every decoder layer);
- ``decode tok/s``: generated tokens per second of the one-token steps (total minus prefill);
- ``new tok/s``: generated tokens per second of a whole generation call (what Hugging Face's
  ``generate`` is usually quoted at), median of ``--repeats`` calls after one compiling call, from
  one ``Generator`` (the decoder's layers unstacked once, as HF's model is loaded once).
  The systems of a case take turns, one call each per round (``alternating_medians``): on a
  shared host a peer timed minutes later ran 244-351 new tokens/s within one day;
- ``GFLOP/seq``: analytic inference FLOPs per sequence (t5like.evaluation.cost, docs/flops.md:
  prefill + decode, forward only) — the paper's inference-cost comparison.

``--peer`` adds Hugging Face transformers' ``LlamaForCausalLM.generate`` (greedy, KV cache) on
PyTorch at the DecLLM shapes, when torch and transformers are installed (never a dependency of
t5like), and prints t5like's ratio to it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any, Callable, NamedTuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # A checkout.

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from benchmarks import timing  # noqa: E402
from benchmarks.train_throughput import peer_device  # noqa: E402  (PyTorch where JAX runs)
from t5like.config.model import ModelConfig  # noqa: E402
from t5like.evaluation.cost import inference_flops  # noqa: E402
from t5like.inference import generation as gen  # noqa: E402
from t5like.inference.sampling import SamplingConfig  # noqa: E402
from t5like.models import build_model  # noqa: E402


def small_model_config(family: str, dtype: str) -> ModelConfig:
  return ModelConfig(family=family, vocab_size=8192, d_model=512, num_heads=8, head_dim=64,
                     d_ff=1408, num_layers=4, num_encoder_layers=2, num_decoder_layers=2,
                     attn_out_norm=family == "redllm", dtype=dtype).validate()


def parse_case(text: str) -> tuple[int, int, int]:
  """``"8x128+64"`` -> (batch 8, prompt 128, new 64)."""
  try:
    batch, rest = text.split("x")
    prompt, new = rest.split("+")
    return int(batch), int(prompt), int(new)
  except ValueError:
    raise SystemExit(f"--cases: {text!r} is not BATCHxPROMPT+NEW (e.g. 8x128+64)") from None


def prefill_seconds(generator: gen.Generator, prompts, new: int, repeats: int) -> float:
  """Median time of the prefill (and first logits) alone, as ``generate`` runs it."""
  g = generator
  tokens, lens = gen._pad_inputs(prompts, g.cfg.family, len(prompts))
  plan = gen._Plan(g.cfg.family, tokens.shape[1], new, -1, SamplingConfig())

  @jax.jit
  def fn(params, t, n):
    return gen._prefill(nnx.merge(g._graphdef, params), plan, t, n)[:2]

  return timing.median_seconds(lambda: jax.block_until_ready(fn(g._params, tokens, lens)),
                               repeats)


class System(NamedTuple):
  """One system of a case: ``call()`` runs one whole generation call; ``row(seconds)`` makes
  its table row from the median call time."""
  call: Callable[[], Any]
  row: Callable[[float], dict]


def t5like_system(family: str, dtype: str, batch: int, prompt: int, new: int, repeats: int) -> System:
  cfg = small_model_config(family, dtype)
  model = build_model(cfg, nnx.Rngs(0))
  params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  rng = np.random.RandomState(0)
  prompts = [rng.randint(2, cfg.vocab_size, size=prompt).tolist() for _ in range(batch)]
  generator = gen.Generator(model)  # The decode layout once, as eval.py's generation uses it.

  def call():
    return generator(prompts, max_new_tokens=new, eos_id=-1)

  def row(total: float) -> dict:
    pre = prefill_seconds(generator, prompts, new, repeats)
    return {"system": f"t5like {family}",
            "dtype": dtype, "params_m": params / 1e6, "case": f"{batch}x{prompt}+{new}",
            "prefill_tok_s": batch * prompt / pre,
            "decode_tok_s": batch * new / max(total - pre, 1e-9),
            "new_tok_s": batch * new / total,
            "gflop_seq": inference_flops(cfg, prompt, new)["total"] / 1e9}

  return System(call, row)


def peer_system(dtype: str, batch: int, prompt: int, new: int) -> System | None:
  """transformers' Llama at the DecLLM shapes (tied embeddings, RMSNorm, SwiGLU, RoPE)."""
  try:
    import torch
    import transformers
  except ImportError:
    return None
  torch.manual_seed(0)
  config = transformers.LlamaConfig(
      vocab_size=8192, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
      num_attention_heads=8, num_key_value_heads=8, head_dim=64, tie_word_embeddings=True,
      max_position_embeddings=4096)
  torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
  device = peer_device(torch)
  model = transformers.LlamaForCausalLM(config).to(torch_dtype).to(device).eval()
  ids = torch.randint(2, 8192, (batch, prompt), device=device)

  def call():
    with torch.inference_mode():
      model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                     min_new_tokens=new, do_sample=False, pad_token_id=0)
    if device == "cuda":
      torch.cuda.synchronize()

  params = sum(p.numel() for p in model.parameters())
  return System(call, lambda total: {
      "system": "transformers Llama (PyTorch)", "dtype": dtype, "params_m": params / 1e6,
      "case": f"{batch}x{prompt}+{new}", "prefill_tok_s": float("nan"),
      "decode_tok_s": float("nan"), "new_tok_s": batch * new / total, "gflop_seq": float("nan")})


def alternating_medians(systems: list[System], repeats: int) -> list[float]:
  """Median call time of each system over ``repeats`` rounds of one call each, the order
  reversed every other round, after one call each (compilation, warm-up): on a shared host the
  systems then see the same machine, not the same machine minutes apart."""
  for s in systems:
    s.call()
  times = timing.alternating([s.call for s in systems], repeats)
  return [statistics.median(t) for t in times]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--cases", default="1x128+64,8x128+64,8x512+128")
  timing.add_dtype_flag(parser, "float32", several=True)
  timing.add_repeats_flag(parser, 3, "alternating rounds (calls of each system)")
  parser.add_argument("--peer", action="store_true", help="also time transformers generate")
  args = parser.parse_args()
  rows = []
  for dtype in args.dtype.split(","):
    for case in args.cases.split(","):
      batch, prompt, new = parse_case(case)
      systems = []
      for family in ("decllm", "redllm"):
        systems.append(t5like_system(family, dtype, batch, prompt, new, args.repeats))
      if args.peer:
        peer = peer_system(dtype, batch, prompt, new)
        if peer is None:
          print("--peer: torch / transformers not installed; no peer rows", file=sys.stderr)
          args.peer = False
        else:
          systems.append(peer)
      start = len(rows)
      rows += [s.row(t) for s, t in zip(systems, alternating_medians(systems, args.repeats))]
      for r in rows[start:]:  # As measured: a cut-off run keeps its rows.
        print(f"  {r['system']} {dtype} {case}: {r['new_tok_s']:,.0f} new tokens/s",
              file=sys.stderr, flush=True)
  print(f"| system | dtype | params (M) | batch x prompt + new | prefill tok/s | decode tok/s "
        f"| new tok/s | GFLOP/seq |")
  print("|---|---|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['system']} | {r['dtype']} | {r['params_m']:.1f} | {r['case']} | "
          f"{r['prefill_tok_s']:,.0f} | {r['decode_tok_s']:,.0f} | {r['new_tok_s']:,.0f} | "
          f"{r['gflop_seq']:.2f} |".replace("nan", "-"))
  peers = {(r["dtype"], r["case"]): r for r in rows if not r["system"].startswith("t5like")}
  for r in rows:
    p = peers.get((r["dtype"], r["case"]))
    if p and r["system"].startswith("t5like decllm"):
      print(f"{r['case']} {r['dtype']}: {r['system']} / transformers = "
            f"{r['new_tok_s'] / p['new_tok_s']:.2f}x new tokens/s")


if __name__ == "__main__":
  main()
