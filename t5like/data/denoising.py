"""Denoising objectives as seqio preprocessors: T5 span corruption and UL2's denoisers.

Span corruption (Raffel et al. 2020, §3.1.4) on a chunk of ``L`` tokens:

* ``num_noise = round(L * noise_density)`` clipped to ``[1, L - 1]`` tokens are corrupted, in
  ``num_spans = round(num_noise / mean_noise_span_length)`` spans (at least 1, at most the number
  of clean tokens). The noise tokens are split into ``num_spans`` spans of random positive
  lengths, the clean tokens likewise, and the spans alternate clean, noise, clean, noise, ...
  (so the chunk starts clean and ends with noise, and no two noise spans touch).
* ``inputs``: the clean tokens, each noise span replaced by one sentinel; ``targets``: each
  sentinel followed by the span it replaced; both end in EOS (T5's layout; seqio's
  ``append_eos_after_trim`` after the denoiser, the task's features ``add_eos=True``).
  Sentinel ``i`` (0-based) is id ``V - 1 - i`` of a vocabulary of ``V`` ids: they count down
  from the top, inside the ``data.extra_ids`` reserved ids (seqio's
  ``SentencePieceVocabulary(extra_ids=...)``).
* Lengths: `span_chunk_length` is the longest chunk whose inputs and targets, EOS included, fit
  ``inputs_length`` / ``targets_length`` (one position fewer for inputs when a mode token is
  prepended): T5's ``random_spans_helper`` (568 tokens -> 512 / 114 at density 0.15, span 3).

Randomness is stateless per example with seqio's seeds (``map_over_dataset(num_seeds=1)``), as
the random prefix split: same ``data.seed``, same corruption, across restarts and hosts.

Why by hand: seqio ships no span corruption (it lives in the ``t5`` package, whose pins conflict
with this project's jax/TensorFlow), so this module implements T5's definition in tf ops.

UL2 (Tay et al. 2022): each denoiser is a seqio task (span corruption with its own density and
mean span, or the prefix LM "S" denoiser), its inputs prefixed with a mode token; the tasks are
mixed by rate (`t5like.data.tasks`). Mode tokens are the lowest reserved ids
``V - extra_ids + j`` (j = 0: R, 1: X, 2: S), below every sentinel the run can use.
"""
from __future__ import annotations

import functools
from typing import Callable, Mapping

import seqio
import tensorflow as tf

from t5like.config.spans import (  # noqa: F401 (API)
    corrupted_lengths, max_sentinels, span_chunk_length, span_counts)

MODES = ("r", "x", "s")


def _random_parts(total: tf.Tensor, parts: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
  """``parts`` positive int32 lengths summing to ``total``, uniform over all such splits."""
  # Cut points: ``parts - 1`` distinct positions among 1..total-1, chosen by a seeded shuffle.
  order = tf.argsort(tf.random.stateless_uniform([total - 1], seed=seed))
  cuts = tf.sort(order[:parts - 1] + 1)
  bounds = tf.concat([[0], cuts, [total]], axis=0)
  return bounds[1:] - bounds[:-1]


def noise_mask(length: tf.Tensor, noise_density: float, mean_noise_span_length: float,
               seed: tf.Tensor) -> tf.Tensor:
  """Bool ``[length]``: True on corrupted tokens (alternating spans, clean first, noise last)."""
  # float32 and round-half-to-even as T5's `random_spans_noise_mask` (and `span_counts`).
  lf = tf.cast(length, tf.float32)
  num_noise = tf.clip_by_value(tf.cast(tf.round(lf * noise_density), tf.int32), 1, length - 1)
  num_spans = tf.maximum(
      tf.cast(tf.round(tf.cast(num_noise, tf.float32) / mean_noise_span_length), tf.int32), 1)
  num_spans = tf.minimum(num_spans, length - num_noise)
  seeds = tf.random.experimental.stateless_split(seed, 2)
  noise = _random_parts(num_noise, num_spans, seeds[0])
  clean = _random_parts(length - num_noise, num_spans, seeds[1])
  lengths = tf.reshape(tf.stack([clean, noise], axis=1), [-1])
  flags = tf.tile([False, True], [num_spans])
  return tf.repeat(flags, lengths)


def _replace_spans(tokens: tf.Tensor, mask: tf.Tensor, first_sentinel: int) -> tf.Tensor:
  """Each maximal run of ``mask`` becomes one sentinel (``first_sentinel``, then one lower...)."""
  prev = tf.concat([[False], mask[:-1]], axis=0)
  starts = mask & ~prev
  sentinel = first_sentinel + 1 - tf.cumsum(tf.cast(starts, tf.int32))
  out = tf.where(starts, sentinel, tokens)
  return tf.boolean_mask(out, ~(mask & prev))


def corrupt(tokens: tf.Tensor, mask: tf.Tensor, vocab_size: int) -> dict[str, tf.Tensor]:
  """``{"inputs", "targets"}`` of ``tokens`` under ``mask`` (see the module docstring)."""
  top = vocab_size - 1
  inputs = _replace_spans(tokens, mask, top)
  # The targets replace the clean spans instead: clean span i precedes noise span i, so its
  # sentinel is the one that noise span got in the inputs.
  targets = _replace_spans(tokens, ~mask, top)
  return {"inputs": inputs, "targets": targets}


def mode_token_id(vocab_size: int, extra_ids: int, mode: str) -> int:
  """The reserved id of UL2 mode ``mode`` ("r", "x", "s"): the lowest extra ids."""
  return vocab_size - extra_ids + MODES.index(mode)


def _vocab_size(output_features: Mapping[str, seqio.Feature]) -> int:
  return output_features["targets"].vocabulary.vocab_size


def _extra_ids(output_features: Mapping[str, seqio.Feature]) -> int:
  return int(getattr(output_features["targets"].vocabulary, "extra_ids", 0) or 0)


def _prepend(tokens: tf.Tensor, token: int | None) -> tf.Tensor:
  return tokens if token is None else tf.concat([[token], tokens], axis=0)


def span_corruption(dataset: tf.data.Dataset, sequence_length: Mapping[str, int],
                    output_features: Mapping[str, seqio.Feature], *,
                    noise_density: float = 0.15, mean_noise_span_length: float = 3.0,
                    mode: str = "", chunking: str = "stream") -> tf.data.Dataset:
  """Tokenised ``{"targets"}`` documents -> span-corrupted ``{"inputs", "targets"}`` examples.

  ``mode`` ("r"/"x", or "" for none) prepends that UL2 mode token to the inputs.
  """
  from t5like.data import objectives  # pylint: disable=g-import-not-at-top

  vocab_size, extra = _vocab_size(output_features), _extra_ids(output_features)
  token = mode_token_id(vocab_size, extra, mode) if mode else None
  ilen = sequence_length["inputs"] - (1 if mode else 0)
  chunk = span_chunk_length(ilen, sequence_length["targets"], noise_density,
                            mean_noise_span_length)
  eos = output_features["targets"].vocabulary.eos_id
  ds = (objectives.stream_documents(dataset, chunk, eos) if chunking == "stream" else
        objectives.split_documents(dataset, chunk, eos, min_length=2))

  @seqio.map_over_dataset(num_seeds=1)
  def _corrupt(ex, seed):
    tokens = tf.cast(ex["targets"], tf.int32)
    mask = noise_mask(tf.size(tokens), noise_density, mean_noise_span_length, seed)
    out = corrupt(tokens, mask, vocab_size)
    return {"inputs": _prepend(out["inputs"], token), "targets": out["targets"]}

  return _corrupt(ds)


def prefix_lm_denoiser(dataset: tf.data.Dataset, sequence_length: Mapping[str, int],
                       output_features: Mapping[str, seqio.Feature], *,
                       chunking: str = "stream") -> tf.data.Dataset:
  """UL2's S denoiser: a prefix LM split anywhere in its chunk (``objectives.prefix_lm_random``:
  uniform over the chunk, padded inputs / targets as T5's prefix LM), the S mode token before
  the inputs; the lengths leave room for it and for the EOS after inputs and targets."""
  from t5like.data import objectives  # pylint: disable=g-import-not-at-top

  token = mode_token_id(_vocab_size(output_features), _extra_ids(output_features), "s")
  lengths = {"inputs": sequence_length["inputs"] - 2, "targets": sequence_length["targets"] - 1}
  ds = objectives.prefix_lm_random(dataset, lengths, output_features, chunking)
  return ds.map(lambda ex: {"inputs": _prepend(ex["inputs"], token), "targets": ex["targets"]},
                num_parallel_calls=tf.data.AUTOTUNE)


def preprocessors(denoiser: tuple, chunking: str) -> list[Callable[..., tf.data.Dataset]]:
  """seqio preprocessors of one denoiser ``(mode, noise_density, mean_noise_span_length)`` on
  ``{"text"}`` records (mode "" = plain span corruption, "r"/"x" = UL2 span denoisers with their
  mode token, "s" = UL2's prefix LM)."""
  mode, density, mean_span = denoiser
  head = [functools.partial(seqio.preprocessors.rekey, key_map={"targets": "text"}),
          functools.partial(seqio.preprocessors.tokenize, copy_pretokenized=False)]
  tail = [seqio.preprocessors.append_eos_after_trim]  # The lengths left the EOS its place.
  if mode == "s":
    return head + [functools.partial(prefix_lm_denoiser, chunking=chunking)] + tail
  return head + [functools.partial(span_corruption, noise_density=density,
                                   mean_noise_span_length=mean_span, mode=mode,
                                   chunking=chunking)] + tail
