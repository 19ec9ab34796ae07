"""Greedy decode of ``gpu_train.py``'s models against the HBM-bandwidth floor (the decode rows of
``make bench-gpu``): the per-token step time is the difference of two generation lengths
(prefill and compilation cancel); the floor is the bytes a step reads over the card's HBM
bandwidth."""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from benchmarks import timing

# HBM bandwidth per device, bytes/s (first match of the lower-cased device kind).
HBM_BANDWIDTH = (("h200", 4.8e12), ("h100 pcie", 2.0e12), ("h100", 3.35e12), ("a100", 2.0e12),
                 ("l4", 0.3e12))


def hbm_bandwidth(device_kind: str) -> float:
  kind = device_kind.lower()
  return next((bw for key, bw in HBM_BANDWIDTH if key in kind), 0.0)


def decode_floor_bytes(cfg, params: dict, batch: int, context: float, encoder_length: int = 0
                       ) -> float:
  """Bytes one greedy decode step reads: the weights it uses as the decode layout holds them
  (a bf16 model: its dense kernels and tables at 2 bytes, norms at 4; RedLLM: not the encoder's),
  and the KV cache: ``context`` cached tokens of the decoder's
  own (mean over the timed steps) in every self-attention layer, RedLLM's ``encoder_length``
  encoder keys and values in every cross-attention."""
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  weights = sum(x.size * x.dtype.itemsize for path, x in leaves
                if not jax.tree_util.keystr(path).startswith("['encoder"))
  kv = 2 * cfg.kv_heads * cfg.head_dim * np.dtype(cfg.dtype).itemsize * batch
  if cfg.family == "decllm":
    return float(weights + cfg.num_layers * kv * context)
  return float(weights + cfg.num_decoder_layers * kv * (context + encoder_length))


def decode_rows(model_cfg, bandwidth: float, batches=(1, 8), prompt: int = 128,
                news=(16, 80)) -> list[dict]:
  """Rows of greedy decode of ``model_cfg`` (a ModelConfig; random weights, ``prompt``-token
  random prompts) at each batch size: ms per token and the share of the HBM floor it reaches."""
  from flax import nnx

  from t5like.inference import generation as gen
  from t5like.models import build_model
  cfg = dataclasses.replace(model_cfg, attention_impl="reference")  # Decoding reads a KV cache.
  family = cfg.family
  generator = gen.Generator(build_model(cfg, nnx.Rngs(0)))
  params = generator._params  # What a decode step reads (the decode layout's dtypes).
  rng = np.random.default_rng(0)
  rows = []
  for b in batches:
    prompts = [rng.integers(2, cfg.vocab_size, size=prompt).tolist() for _ in range(b)]
    t = {n: timing.median_seconds(lambda n=n: generator(prompts, max_new_tokens=n, eos_id=-1), 3)
         for n in news}
    step_s = (t[news[1]] - t[news[0]]) / (news[1] - news[0])
    mean_new = (news[0] + news[1]) / 2  # Mean decoder tokens cached over the timed steps.
    context, enc = (prompt + mean_new, 0) if family == "decllm" else (mean_new, prompt)
    floor_s = decode_floor_bytes(cfg, params, b, context, enc) / bandwidth if bandwidth else 0
    rows.append({"row": f"{family} decode batch {b}", "step_ms": step_s * 1e3,
                 "floor_ms": floor_s * 1e3, "of_floor": floor_s / step_s if floor_s else
                 float("nan"), "tokens_s": b / step_s})
    print(f"  {rows[-1]}", flush=True)
  return rows
