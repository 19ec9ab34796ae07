"""Model FLOPs by the docs/flops.md (MaxText) convention, and device peaks for MFU.

Per layer, forward, B sequences of length S: SwiGLU FFN ``6·B·S·d·d_ff`` (an MoE layer: only
the experts a token uses, ``6·B·S·d·(K + N_s)·d_expert``, plus its router ``2·B·S·d·N_r``); Q/K/V projections
``2·B·S·d·(H_q + 2·H_kv)·d_h``; output projection ``2·B·S·d·H_q·d_h``; attention scores and
values ``4·B·S_q·S_kv·H·d_h``, halved when causal (DecLLM, RedLLM decoder self-attention; a
PrefixLM decoder is counted as causal); logits ``2·B·S·d·V`` once. Training = 3 × forward.

RedLLM: encoder layers over the input length (bidirectional, full attention); decoder layers over
the target length: causal self-attention, then cross-attention whose queries come from the
``S_d`` decoder tokens and keys/values from the ``S_e`` encoder tokens (K/V projections over
``S_e``, attention ``4·B·S_d·S_e·H·d_h`` full). Logits over the decoder length only.
Embedding lookups, norms, RoPE, softmax and the optimizer are not counted (as in MaxText).
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from t5like.config.model import ModelConfig
from t5like.config.moe import stack_moe_flags


def _proj_flops(cfg: ModelConfig, b: int, s_q: int, s_kv: int) -> float:
  d, h, g, k = cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.head_dim
  return 2.0 * b * s_q * d * h * k + 2.0 * b * s_kv * d * 2 * g * k + 2.0 * b * s_q * d * h * k


def _attn_flops(cfg: ModelConfig, b: int, s_q: int, s_kv: int, causal: bool) -> float:
  f = 4.0 * b * s_q * s_kv * cfg.num_heads * cfg.head_dim
  return f / 2 if causal else f


def _ffn_flops(cfg: ModelConfig, b: int, s: int, stack: str, num_layers: int) -> float:
  """The feed-forwards of all ``num_layers`` layers of a stack, counting active experts only."""
  m, d = cfg.moe, cfg.d_model
  dense = 6.0 * b * s * d * cfg.d_ff
  moe = 6.0 * b * s * d * (m.top_k + m.num_shared_experts) * m.expert_d_ff + \
      2.0 * b * s * d * m.num_experts
  return sum(moe if f else dense for f in stack_moe_flags(m, stack, num_layers))


def forward_flops(cfg: ModelConfig, batch: int, decoder_length: int,
                  encoder_length: int = 0) -> float:
  """Forward FLOPs of one batch (``encoder_length`` is used by RedLLM only)."""
  b, s = batch, decoder_length
  logits = 2.0 * b * s * cfg.d_model * cfg.vocab_size
  if cfg.family == "decllm":
    layer = _proj_flops(cfg, b, s, s) + _attn_flops(cfg, b, s, s, True)
    return cfg.num_layers * layer + _ffn_flops(cfg, b, s, "decoder", cfg.num_layers) + logits
  se = encoder_length
  enc = _proj_flops(cfg, b, se, se) + _attn_flops(cfg, b, se, se, False)
  dec = (_proj_flops(cfg, b, s, s) + _attn_flops(cfg, b, s, s, True)
         + _proj_flops(cfg, b, s, se) + _attn_flops(cfg, b, s, se, False))
  return (cfg.num_encoder_layers * enc + _ffn_flops(cfg, b, se, "encoder", cfg.num_encoder_layers)
          + cfg.num_decoder_layers * dec + _ffn_flops(cfg, b, s, "decoder", cfg.num_decoder_layers)
          + logits)


def train_flops(cfg: ModelConfig, batch: int, decoder_length: int,
                encoder_length: int = 0) -> float:
  """Training FLOPs of one step (forward + backward = 3 × forward)."""
  return 3.0 * forward_flops(cfg, batch, decoder_length, encoder_length)


def batch_lengths(batch: dict) -> tuple[int, int]:
  """(decoder_length, encoder_length) of a feature dict (encoder_length 0 for DecLLM)."""
  dec = batch["decoder_input_tokens"].shape[1]
  enc = batch["encoder_input_tokens"].shape[1] if "encoder_input_tokens" in batch else 0
  return int(dec), int(enc)


# Dense bf16 peaks per device (chip), FLOP/s.
_PEAKS = (
    ("tpu v6", 918e12), ("tpu v5 lite", 197e12), ("tpu v5e", 197e12), ("tpu v5p", 459e12),
    ("tpu v5", 459e12), ("tpu v4", 275e12), ("tpu v3", 123e12), ("h200", 989e12),
    ("h100", 989e12), ("a100", 312e12), ("l4", 121e12),
)
# CPU peaks are measured, per process and dtype (host-platform "devices" share the same cores).
_CPU_PEAK_CACHE: dict[str, float] = {}
_probe_matmul = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))


def measured_cpu_peak(compute_dtype: str, n: int = 1024, min_seconds: float = 0.0,
                      refresh: bool = False) -> float:
  """FLOP/s of the whole host's CPU devices on a plain ``n x n`` matmul in ``compute_dtype``
  (bf16/f16 operands with f32 accumulation, the fast path on XLA:CPU): the best of at least five
  products and of ``min_seconds`` of them, measured once per process (~0.1 s). CPU types differ
  by ~2.5x (docs/performance.md), so no constant holds.

  ``refresh`` probes again and keeps the best of every probe so far: a peak is the most the host
  was seen to do, and on a shared VM a probe that falls in a slow stretch reads up to ~2x low
  (which showed as an MFU above 100 %). Benchmarks refresh between measurements.
  """
  key = f"{compute_dtype}:{n}"
  if key not in _CPU_PEAK_CACHE or refresh:
    dt = jnp.dtype(compute_dtype)
    cpu = jax.local_devices(backend="cpu")[0]
    a = jax.device_put(jnp.ones((n, n), dt), cpu)
    _probe_matmul(a, a).block_until_ready()  # Compiles on the first probe of a shape/dtype.
    best, reps, start = float("inf"), 0, time.perf_counter()
    while reps < 5 or time.perf_counter() - start < min_seconds:
      t = time.perf_counter()
      _probe_matmul(a, a).block_until_ready()
      best = min(best, time.perf_counter() - t)
      reps += 1
    _CPU_PEAK_CACHE[key] = max(_CPU_PEAK_CACHE.get(key, 0.0), 2.0 * n ** 3 / best)
  return _CPU_PEAK_CACHE[key]


def peak_flops_per_device(configured: float, compute_dtype: str) -> float:
  """The configured peak, else a lookup by device kind (0.0 if unknown: MFU not reported)."""
  if configured > 0:
    return configured
  dev = jax.local_devices()[0]
  if dev.platform == "cpu":  # One matmul probe per process: the host's own peak.
    return measured_cpu_peak(compute_dtype) / jax.local_device_count()
  kind = dev.device_kind.lower()
  for key, peak in _PEAKS:
    if key in kind:
      return peak
  return 0.0
