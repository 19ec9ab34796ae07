"""Inference cost per sequence: analytic FLOPs (docs/flops.md convention) and measured speed.

Convention (forward only, one sequence, input length ``n``, ``m`` generated tokens, KV cache):
prefill runs the input once (DecLLM: the decoder over ``n`` tokens, causal — a prefix LM's
bidirectional prompt is counted the same way, as in training; RedLLM: the encoder over ``n``
tokens, bidirectional, plus the cross-attention K/V projections of every decoder layer once);
each of the ``m`` decode steps runs one token through every decoder layer, attending to the
cached keys (DecLLM: ``n + t``; RedLLM: ``t`` decoder and ``n`` encoder keys); logits are
computed for the ``m`` generated tokens only. Per token and layer: Q/K/V/O projections
``2 d (2 H_q + 2 H_kv) d_h``, SwiGLU ``6 d d_ff``, attention ``4 S_kv H d_h``; logits ``2 d V``.
"""
from __future__ import annotations

from t5like.config.model import ModelConfig


def _token_layer(cfg: ModelConfig, kv_len: float) -> float:
  d, h, g, k = cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.head_dim
  return 2.0 * d * (2 * h + 2 * g) * k + 6.0 * d * cfg.d_ff + 4.0 * kv_len * h * k


def _cross_q_o(cfg: ModelConfig, kv_len: float) -> float:
  d, h, k = cfg.d_model, cfg.num_heads, cfg.head_dim
  return 2.0 * d * 2 * h * k + 4.0 * kv_len * h * k  # Q and O projections + attention.


def inference_flops(cfg: ModelConfig, input_len: int, output_len: int) -> dict[str, float]:
  """{"prefill", "decode", "total"} forward FLOPs of one sequence (see module docstring)."""
  n, m = input_len, output_len
  d, g, k, v = cfg.d_model, cfg.kv_heads, cfg.head_dim, cfg.vocab_size
  if cfg.family == "decllm":
    # Prefill: causal attention over the prompt = average key length (n + 1) / 2 per token.
    prefill = cfg.num_layers * n * _token_layer(cfg, (n + 1) / 2)
    decode = sum(cfg.num_layers * _token_layer(cfg, n + t + 1) for t in range(m))
  else:
    prefill = cfg.num_encoder_layers * n * _token_layer(cfg, n)
    prefill += cfg.num_decoder_layers * n * 2.0 * d * 2 * g * k  # Cross K/V, cached once.
    decode = sum(cfg.num_decoder_layers * (_token_layer(cfg, t + 1) + _cross_q_o(cfg, n))
                 for t in range(m))
  decode += m * 2.0 * d * v
  return {"prefill": prefill, "decode": decode, "total": prefill + decode}
