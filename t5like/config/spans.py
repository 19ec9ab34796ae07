"""Span-corruption length arithmetic (pure Python: the config checks it before any data is read).

T5's layout (``t5.data.preprocessors.span_corruption`` / ``random_spans_helper``): a chunk of
``L`` tokens gets ``round(L * noise_density)`` noise tokens (clipped to ``[1, L - 1]``) in
``round(noise / mean_noise_span_length)`` spans (at least 1, at most the clean tokens); the inputs
are the clean tokens and one sentinel per span, the targets one sentinel per span and the noise
tokens, **each followed by EOS**. At T5's 512 / 114 a chunk is 568 tokens.

Rounding is T5's mask's (``random_spans_noise_mask``): float32 products, round half to even
(190 x 0.15 = 28.5000011 in float32: 29 noise tokens, where float64's 28.499999999999996 gives
28). `t5like.data.denoising` draws its masks with the same counts, so the lengths here are the
data's exactly. (T5's own ``random_spans_helper`` rounds in float64; where the two differ, T5's
data can be a token longer than its helper says.)
"""
from __future__ import annotations

import numpy as np

EOS_TOKENS = 1  # One EOS after the inputs and one after the targets.


def span_counts(length: int, noise_density: float, mean_noise_span_length: float
                ) -> tuple[int, int]:
  """(noise tokens, noise spans) of a chunk of ``length`` tokens (Python ints, float32 rounding
  as T5's mask)."""
  f32 = np.float32
  num_noise = int(np.round(f32(length) * f32(noise_density)))
  num_noise = min(max(num_noise, 1), length - 1)
  num_spans = max(int(np.round(f32(num_noise) / f32(mean_noise_span_length))), 1)
  return num_noise, min(num_spans, length - num_noise)


def corrupted_lengths(length: int, noise_density: float, mean_noise_span_length: float
                      ) -> tuple[int, int]:
  """(inputs, targets) lengths after span corruption of ``length`` tokens, EOS included."""
  noise, spans = span_counts(length, noise_density, mean_noise_span_length)
  return length - noise + spans + EOS_TOKENS, noise + spans + EOS_TOKENS


def span_chunk_length(inputs_length: int, targets_length: int, noise_density: float,
                      mean_noise_span_length: float) -> int:
  """Longest chunk such that every chunk of 2..that many tokens fits both lengths."""
  best = 0
  for length in range(2, 4 * (inputs_length + targets_length)):
    ilen, tlen = corrupted_lengths(length, noise_density, mean_noise_span_length)
    if ilen > inputs_length or tlen > targets_length:
      break
    best = length
  if best < 2:
    raise ValueError(
        f"span corruption (noise_density={noise_density}, mean_noise_span_length="
        f"{mean_noise_span_length}) fits no chunk in inputs_length={inputs_length}, "
        f"targets_length={targets_length}; raise data.targets_length")
  return best


def max_sentinels(inputs_length: int, targets_length: int, noise_density: float,
                  mean_noise_span_length: float) -> int:
  """Most sentinels one example can use (the spans of the longest chunk)."""
  length = span_chunk_length(inputs_length, targets_length, noise_density,
                             mean_noise_span_length)
  return max(span_counts(n, noise_density, mean_noise_span_length)[1]
             for n in range(2, length + 1))
