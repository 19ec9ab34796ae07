"""Training objectives as seqio preprocessors (docs/paper.md §1 "Training").

Pretraining tasks read plain documents (``text``); after tokenisation each document gets an EOS.
Two chunkings (``data.pretrain_chunking``) turn documents into chunks of ``chunk`` tokens:

* ``"stream"`` (the paper's, as T5 pretraining): documents are concatenated into one token stream
  cut into full chunks of exactly ``chunk`` tokens; a chunk may span several documents (attention
  crosses the boundary, as in T5) and a RedLLM row is always ``inputs + targets`` tokens. The
  stream's last partial chunk (end of a finite split, end of an epoch) is dropped.
* ``"document"``: each document is cut on its own (its last chunk is shorter), so no token is
  dropped and no chunk spans two documents; seqio's packing later fills rows with chunks.

* ``causal`` (DecLLM): chunk = ``sequence_length["targets"]``; the chunk is the ``targets``.
* ``prefix`` (RedLLM, and DecLLM + bidirectional prefix): chunk = ``inputs + targets`` lengths; a
  chunk of ``L`` tokens is split into ``inputs = chunk[:k]`` and ``targets = chunk[k:]``:
  "middle": ``k = floor(L * I / (I + T))`` (``L/2`` for the paper's 1024/1024), clipped to
  ``[1, L-1]``. "random" (T5's prefix LM, Wang et al.'s non-causal decoder): chunks of
  ``min(I, T) + 1`` tokens, ``k`` uniform over ``[1, L-1]`` (anywhere in the chunk), so every
  split fits both lengths and the rows are padded (packing fills them); stateless and seeded by
  seqio (same seed, same splits). Chunks shorter than 2 tokens are dropped (nothing to split).
* ``inputs_targets`` (instruction tuning): the records' inputs/targets, each truncated to its
  length with the EOS kept (``append_eos_after_trim``).
"""
from __future__ import annotations

import functools
from typing import Callable, Mapping, Sequence

import seqio
import tensorflow as tf

PRETRAIN_VARIANTS = ("lm", "prefix_middle", "prefix_random")
CHUNKINGS = ("stream", "document")


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


def stream_documents(dataset: tf.data.Dataset, chunk_length: int, eos_id: int,
                     group: int = 64) -> tf.data.Dataset:
  """Documents + EOS concatenated into one stream, cut into full chunks of ``chunk_length``.

  Documents are gathered ``group`` at a time (one ragged batch), appended to the tokens carried
  over from the previous group, and cut; the remainder (< ``chunk_length``) is carried on in the
  ``scan`` state, so the state a checkpoint saves is exactly the unfinished chunk.
  """

  def _with_eos(ex):
    return tf.concat([tf.cast(ex["targets"], tf.int32), [eos_id]], axis=0)

  def _cut(carry, docs):
    tokens = tf.concat([carry, docs.flat_values], axis=0)
    n = tf.size(tokens) // chunk_length
    full = tf.reshape(tokens[:n * chunk_length], [n, chunk_length])
    return tokens[n * chunk_length:], full

  ds = dataset.map(_with_eos, num_parallel_calls=tf.data.AUTOTUNE).ragged_batch(group)
  ds = ds.scan(tf.zeros([0], tf.int32), _cut).unbatch()
  return ds.map(lambda chunk: {"targets": chunk})


def _chunker(chunking: str) -> Callable[..., tf.data.Dataset]:
  if chunking == "stream":
    return stream_documents
  if chunking == "document":
    return split_documents
  raise ValueError(f"unknown pretrain chunking {chunking!r}; expected one of {CHUNKINGS}")


def middle_split_point(length: tf.Tensor, inputs_length: int, targets_length: int) -> tf.Tensor:
  """``floor(L * I / (I + T))`` clipped to ``[1, L - 1]``: the paper's split for I == T."""
  k = (length * inputs_length) // (inputs_length + targets_length)
  return tf.clip_by_value(k, 1, length - 1)


def random_split_chunk(inputs_length: int, targets_length: int) -> int:
  """Chunk length of a random split: every point of ``[1, L - 1]`` fits both lengths."""
  return min(inputs_length, targets_length) + 1


def random_split_point(length: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
  """Uniform over ``[1, L - 1]``: any split of the chunk (at least one token on each side)."""
  return tf.random.stateless_uniform([], seed=seed, minval=1, maxval=tf.maximum(length, 2),
                                     dtype=tf.int32)


def causal_lm(dataset: tf.data.Dataset, sequence_length: Mapping[str, int],
              output_features: Mapping[str, seqio.Feature],
              chunking: str = "document") -> tf.data.Dataset:
  """DecLLM pretraining: chunks of ``sequence_length["targets"]`` tokens as ``targets``."""
  return _chunker(chunking)(dataset, sequence_length["targets"], _eos_id(output_features))


def _split_example(ex, k):
  tokens = ex["targets"]
  return {"inputs": tokens[:k], "targets": tokens[k:]}


def prefix_lm_middle(dataset: tf.data.Dataset, sequence_length: Mapping[str, int],
                     output_features: Mapping[str, seqio.Feature],
                     chunking: str = "document") -> tf.data.Dataset:
  """Prefix LM with the split in the middle of each chunk of ``inputs + targets`` tokens."""
  ilen, tlen = sequence_length["inputs"], sequence_length["targets"]
  ds = chunk_for_prefix_lm(dataset, sequence_length, output_features, chunking)
  return ds.map(
      lambda ex: _split_example(ex, middle_split_point(tf.size(ex["targets"]), ilen, tlen)),
      num_parallel_calls=tf.data.AUTOTUNE)


@seqio.map_over_dataset(num_seeds=1)
def _random_split(ex, seed):
  return _split_example(ex, random_split_point(tf.size(ex["targets"]), seed))


def prefix_lm_random(dataset: tf.data.Dataset, sequence_length: Mapping[str, int],
                     output_features: Mapping[str, seqio.Feature],
                     chunking: str = "document") -> tf.data.Dataset:
  """Prefix LM split anywhere: chunks of ``random_split_chunk`` tokens, a uniform split each."""
  chunk = random_split_chunk(sequence_length["inputs"], sequence_length["targets"])
  ds = chunk_for_prefix_lm(dataset, sequence_length, output_features, chunking, chunk=chunk)
  return _random_split(ds)


def chunk_for_prefix_lm(dataset: tf.data.Dataset, sequence_length: Mapping[str, int],
                        output_features: Mapping[str, seqio.Feature],
                        chunking: str = "document", chunk: int | None = None) -> tf.data.Dataset:
  """Chunks of ``chunk`` (default ``inputs + targets``) tokens in ``targets`` (at least 2
  tokens, to be split)."""
  chunk = chunk or sequence_length["inputs"] + sequence_length["targets"]
  if chunking == "stream":
    return stream_documents(dataset, chunk, _eos_id(output_features))
  return split_documents(dataset, chunk, _eos_id(output_features), min_length=2)


def pretraining_preprocessors(variant: str, chunking: str = "document"
                              ) -> list[Callable[..., tf.data.Dataset]]:
  """seqio preprocessors turning ``{"text"}`` records into the objective's examples."""
  _chunker(chunking)  # Validates the name.
  head = [
      functools.partial(seqio.preprocessors.rekey, key_map={"targets": "text"}),
      functools.partial(seqio.preprocessors.tokenize, copy_pretokenized=False),
  ]
  if variant == "lm":
    return head + [functools.partial(causal_lm, chunking=chunking)]
  if variant == "prefix_middle":
    return head + [functools.partial(prefix_lm_middle, chunking=chunking)]
  if variant == "prefix_random":
    return head + [functools.partial(prefix_lm_random, chunking=chunking)]
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
