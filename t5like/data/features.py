"""Feature conversion: seqio's converters with packing, plus RedLLM's continuous positions.

Which converter runs (``model.family`` and the resolved objective):

  DecLLM, causal   -> ``seqio.DecoderFeatureConverter`` on ``{"targets": sequence_length}``:
      decoder_{input,target}_tokens, decoder_loss_weights, decoder_segment_ids, decoder_positions.
  DecLLM, prefix / inputs_targets -> the same converter on ``{"inputs": I, "targets": T}``, which
      dispatches to ``PrefixLMFeatureConverter`` (rows of I+T tokens, loss on targets only) and adds
      ``decoder_causal_attention`` (1 over the inputs and the first target position).
  RedLLM           -> ``seqio.EncDecFeatureConverter``: encoder_{input_tokens,segment_ids,positions}
      + the decoder keys, then `continuous_decoder_positions`.

This module owns the one step seqio lacks: RedLLM's decoder positions continue after that packed
segment's encoder length (docs/paper.md "Continuous positions"). Without packing seqio emits no
segment ids / positions; `add_unpacked_segments` fills them (segment 1 = tokens, 0 = padding) so
the model always sees the same keys.
"""
from __future__ import annotations

from typing import Mapping

from etils import epy

with epy.lazy_imports():  # seqio/TensorFlow load on first use (seconds, ~1 GB).
  import seqio  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

DECODER_KEYS = ("decoder_input_tokens", "decoder_target_tokens", "decoder_loss_weights",
                "decoder_segment_ids", "decoder_positions")
ENCODER_KEYS = ("encoder_input_tokens", "encoder_segment_ids", "encoder_positions")


def continuous_decoder_positions(ex: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
  """Offsets each packed segment's decoder positions by that segment's encoder length.

  Why: RedLLM's cross-attention RoPE needs decoder token t of an example with k encoder tokens at
  position k+t, while seqio's EncDecFeatureConverter restarts decoder positions at 0 per segment.
  Works on one packed row or a batch ``[..., length]``; padding (segment 0) keeps position 0.
  """
  enc_seg = tf.cast(ex["encoder_segment_ids"], tf.int32)
  dec_seg = tf.cast(ex["decoder_segment_ids"], tf.int32)
  enc_rows = tf.reshape(enc_seg, [-1, tf.shape(enc_seg)[-1]])
  dec_rows = tf.reshape(dec_seg, [-1, tf.shape(dec_seg)[-1]])
  num_segments = tf.maximum(tf.reduce_max(enc_seg), tf.reduce_max(dec_seg)) + 1
  # Give every row its own block of segment ids, count encoder tokens per id, read them back.
  base = tf.range(tf.shape(enc_rows)[0])[:, None] * num_segments
  enc_len = tf.math.unsorted_segment_sum(
      tf.ones_like(enc_rows), enc_rows + base, tf.shape(enc_rows)[0] * num_segments)
  offset = tf.reshape(tf.gather(enc_len, dec_rows + base), tf.shape(dec_seg))
  out = dict(ex)
  out["decoder_positions"] = tf.where(
      dec_seg > 0, tf.cast(ex["decoder_positions"], tf.int32) + offset, 0)
  return out


def add_unpacked_segments(ex: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
  """Adds segment ids (1 on tokens, 0 on padding) and positions to an unpacked row."""
  out = dict(ex)
  for prefix, tokens_key in (("encoder", "encoder_input_tokens"),
                             ("decoder", "decoder_target_tokens")):
    if tokens_key not in ex or f"{prefix}_segment_ids" in ex:
      continue
    mask = tf.cast(tf.not_equal(ex[tokens_key], 0), tf.int32)
    # The last non-padding token bounds the segment (a pad id inside an example stays in it).
    length = tf.reduce_max(mask * tf.range(1, tf.size(mask) + 1))
    seg = tf.cast(tf.range(tf.size(mask)) < length, tf.int32)
    out[f"{prefix}_segment_ids"] = seg
    out[f"{prefix}_positions"] = tf.range(tf.size(mask), dtype=tf.int32) * seg
  return out


def make_converter(family: str, pack: bool = True) -> seqio.FeatureConverter:
  """The seqio converter for a model family ("decllm" or "redllm")."""
  if family == "redllm":
    return seqio.EncDecFeatureConverter(pack=pack)
  if family == "decllm":
    return seqio.DecoderFeatureConverter(pack=pack)
  raise ValueError(f"unknown model family {family!r}; expected 'decllm' or 'redllm'")


def loss_on_all_tokens(ex: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
  """DecLLM on inputs+targets rows: loss weight 1 on every token (inputs too), 0 on padding."""
  out = dict(ex)
  out["decoder_loss_weights"] = tf.cast(ex["decoder_segment_ids"] > 0, tf.int32)
  return out


def convert(ds: tf.data.Dataset, *, family: str, task_lengths: Mapping[str, int],
            pack: bool = True, continuous_positions: bool = True,
            loss_on_inputs: bool = False) -> tf.data.Dataset:
  """Task examples -> packed model rows (int32 ``[length]`` features, one row per element).

  ``loss_on_inputs`` (DecLLM, inputs/targets tasks): train on the input tokens too (a causal
  decoder's full-sequence loss, as Wang et al. 2022 compare); otherwise on the targets only.
  """
  ds = make_converter(family, pack)(ds, dict(task_lengths))
  if not pack:
    ds = ds.map(add_unpacked_segments, num_parallel_calls=tf.data.AUTOTUNE)
  if loss_on_inputs and family == "decllm" and "inputs" in task_lengths:
    ds = ds.map(loss_on_all_tokens, num_parallel_calls=tf.data.AUTOTUNE)
  if family == "redllm" and continuous_positions:
    ds = ds.map(continuous_decoder_positions, num_parallel_calls=tf.data.AUTOTUNE)
  return ds.map(lambda ex: {k: tf.cast(v, tf.int32) for k, v in ex.items()},
                num_parallel_calls=tf.data.AUTOTUNE)


def model_feature_lengths(family: str, task_lengths: Mapping[str, int],
                          with_causal_attention: bool) -> dict[str, int]:
  """Model feature name -> row length, as `convert` emits them (computed without seqio)."""
  if family == "redllm":
    enc, dec = task_lengths["inputs"], task_lengths["targets"]
    return {**{k: enc for k in ENCODER_KEYS}, **{k: dec for k in DECODER_KEYS}}
  length = sum(task_lengths[k] for k in ("inputs", "targets") if k in task_lengths)
  out = {k: length for k in DECODER_KEYS}
  if with_causal_attention:
    out["decoder_causal_attention"] = length
  return out
