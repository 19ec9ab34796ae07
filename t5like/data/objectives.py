"""Training objectives as seqio preprocessors (PAPER.md §1 "Training").

Pretraining tasks read plain documents (``text``); after tokenisation each document gets an EOS
and is cut into chunks of at most ``chunk`` tokens (the last chunk of a document is shorter), so no
token is dropped and no chunk spans two documents; seqio's packing later fills rows with chunks.

* ``causal`` (DecLLM): chunk = ``sequence_length["targets"]``; the chunk is the ``targets``.
* ``prefix`` (RedLLM, and DecLLM + bidirectional prefix): chunk = ``inputs + targets`` lengths; a
  chunk of ``L`` tokens is split into ``inputs = chunk[:k]`` and ``targets = chunk[k:]``:
  "middle": ``k = floor(L * I / (I + T))`` (``L/2`` for the paper's 1024/1024), clipped to
  ``[1, L-1]``; "random": ``k`` uniform over ``[max(1, L-T), min(L-1, I)]``, stateless and seeded
  by seqio (same seed, same splits). Chunks shorter than 2 tokens are dropped (nothing to split).
* ``inputs_targets`` (instruction tuning): the records' inputs/targets, each truncated to its
  length with the EOS kept (``append_eos_after_trim``).
"""
from __future__ import annotations

import functools
from typing import Callable, Mapping, Sequence

import seqio
import tensorflow as tf

PRETRAIN_VARIANTS = ("lm", "prefix_middle", "prefix_random")


def _eos_id(output_features: Mapping[str, seqio.Feature]) -> int:
  return output_features["targets"].vocabulary.eos_id


def split_documents(dataset: tf.data.Dataset, chunk_length: int, eos_id: int,
                    min_length: int = 1) -> tf.data.Dataset:
  """Appends EOS to each document's ``targets`` and cuts it into chunks of ``chunk_length``."""

  def _chunks(ex):
    tokens = tf.concat([tf.cast(ex["targets"], tf.int32), [eos_id]], axis=0)
    n = tf.size(tokens)
    num_full = n // chunk_length
    rest = n - num_full * chunk_length
    lengths = tf.concat([tf.fill([num_full], chunk_length), tf.reshape(rest, [1])], axis=0)
    lengths = tf.boolean_mask(lengths, lengths > 0)
    return {"targets": tf.RaggedTensor.from_row_lengths(tokens, lengths)}

  ds = dataset.map(_chunks, num_parallel_calls=tf.data.AUTOTUNE).unbatch()
  if min_length > 1:
    ds = ds.filter(lambda ex: tf.size(ex["targets"]) >= min_length)
  return ds


def middle_split_point(length: tf.Tensor, inputs_length: int, targets_length: int) -> tf.Tensor:
  """``floor(L * I / (I + T))`` clipped to ``[1, L - 1]``: the paper's split for I == T."""
  k = (length * inputs_length) // (inputs_length + targets_length)
  return tf.clip_by_value(k, 1, length - 1)


def random_split_point(length: tf.Tensor, inputs_length: int, targets_length: int,
                       seed: tf.Tensor) -> tf.Tensor:
  """Uniform over ``[max(1, L - T), min(L - 1, I)]`` (every point that fits both lengths)."""
  lo = tf.maximum(1, length - targets_length)
  hi = tf.minimum(length - 1, inputs_length)
  return tf.random.stateless_uniform([], seed=seed, minval=lo, maxval=hi + 1, dtype=tf.int32)


def causal_lm(dataset: tf.data.Dataset, sequence_length: Mapping[str, int],
              output_features: Mapping[str, seqio.Feature]) -> tf.data.Dataset:
  """DecLLM pretraining: chunks of ``sequence_length["targets"]`` tokens as ``targets``."""
  return split_documents(dataset, sequence_length["targets"], _eos_id(output_features))


def _split_example(ex, k):
  tokens = ex["targets"]
  return {"inputs": tokens[:k], "targets": tokens[k:]}


def prefix_lm_middle(dataset: tf.data.Dataset, sequence_length: Mapping[str, int],
                     output_features: Mapping[str, seqio.Feature]) -> tf.data.Dataset:
  """Prefix LM with the split in the middle of each chunk of ``inputs + targets`` tokens."""
  ilen, tlen = sequence_length["inputs"], sequence_length["targets"]
  ds = split_documents(dataset, ilen + tlen, _eos_id(output_features), min_length=2)
  return ds.map(
      lambda ex: _split_example(ex, middle_split_point(tf.size(ex["targets"]), ilen, tlen)),
      num_parallel_calls=tf.data.AUTOTUNE)


@seqio.map_over_dataset(num_seeds=1)
def _random_split(ex, seed, sequence_length):
  ilen, tlen = sequence_length["inputs"], sequence_length["targets"]
  return _split_example(ex, random_split_point(tf.size(ex["targets"]), ilen, tlen, seed))


def chunk_for_prefix_lm(dataset: tf.data.Dataset, sequence_length: Mapping[str, int],
                        output_features: Mapping[str, seqio.Feature]) -> tf.data.Dataset:
  """First half of the random prefix LM: chunks of ``inputs + targets`` tokens in ``targets``."""
  return split_documents(
      dataset, sequence_length["inputs"] + sequence_length["targets"],
      _eos_id(output_features), min_length=2)


def pretraining_preprocessors(variant: str) -> list[Callable[..., tf.data.Dataset]]:
  """seqio preprocessors turning ``{"text"}`` records into the objective's examples."""
  head = [
      functools.partial(seqio.preprocessors.rekey, key_map={"targets": "text"}),
      functools.partial(seqio.preprocessors.tokenize, copy_pretokenized=False),
  ]
  if variant == "lm":
    return head + [causal_lm]
  if variant == "prefix_middle":
    return head + [prefix_lm_middle]
  if variant == "prefix_random":
    return head + [chunk_for_prefix_lm, _random_split]
  raise ValueError(f"unknown pretraining variant {variant!r}; expected one of {PRETRAIN_VARIANTS}")


def instruction_preprocessors() -> list[Callable[..., tf.data.Dataset]]:
  """seqio preprocessors for inputs/targets records (EOS kept after truncation)."""
  return [
      functools.partial(seqio.preprocessors.tokenize, copy_pretokenized=False),
      seqio.preprocessors.append_eos_after_trim,
  ]


def output_features(vocabulary: seqio.Vocabulary, keys: Sequence[str],
                    add_eos: bool) -> dict[str, seqio.Feature]:
  """Output features over one shared vocabulary (EOS added by seqio only if ``add_eos``)."""
  return {k: seqio.Feature(vocabulary=vocabulary, add_eos=add_eos, dtype=tf.int32) for k in keys}
