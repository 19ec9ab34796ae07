"""Span-corruption length arithmetic (pure Python: the config checks it before any data is read).

`t5like.data.denoising` corrupts with the same counts: a chunk of ``L`` tokens gets
``round(L * noise_density)`` noise tokens (clipped to ``[1, L - 1]``) in
``round(noise / mean_noise_span_length)`` spans (at least 1, at most the clean tokens).
"""
from __future__ import annotations


def span_counts(length: int, noise_density: float, mean_noise_span_length: float
                ) -> tuple[int, int]:
  """(noise tokens, noise spans) of a chunk of ``length`` tokens (Python ints)."""
  num_noise = min(max(int(round(length * noise_density)), 1), length - 1)
  num_spans = max(int(round(num_noise / mean_noise_span_length)), 1)
  return num_noise, min(num_spans, length - num_noise)


def corrupted_lengths(length: int, noise_density: float, mean_noise_span_length: float
                      ) -> tuple[int, int]:
  """(inputs, targets) lengths after span corruption of ``length`` tokens."""
  noise, spans = span_counts(length, noise_density, mean_noise_span_length)
  return length - noise + spans, noise + spans


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
