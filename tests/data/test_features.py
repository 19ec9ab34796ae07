"""Packed features exactly right on hand-built examples, per converter, and RedLLM positions."""
import numpy as np
import pytest
import tensorflow as tf

from t5like.data import features


def _ds(examples):
  keys = examples[0].keys()
  return tf.data.Dataset.from_tensor_slices(
      {k: tf.ragged.constant([e[k] for e in examples], dtype=tf.int32) for k in keys})


def _rows(ds):
  return [{k: v.numpy().tolist() for k, v in ex.items()} for ex in ds]


PAIRS = [{"inputs": [7, 8, 5, 1], "targets": [3, 9, 1]},
         {"inputs": [8, 4, 9, 3, 1], "targets": [4, 1]}]


def test_decllm_causal_packed():
  ds = _ds([{"targets": [3, 9, 1]}, {"targets": [4, 1]}])
  (row,) = _rows(features.convert(ds, family="decllm", task_lengths={"targets": 6}))
  assert row == {
      "decoder_target_tokens": [3, 9, 1, 4, 1, 0],
      "decoder_input_tokens": [0, 3, 9, 0, 4, 0],
      "decoder_loss_weights": [1, 1, 1, 1, 1, 0],
      "decoder_segment_ids": [1, 1, 1, 2, 2, 0],
      "decoder_positions": [0, 1, 2, 0, 1, 0],
  }


def test_decllm_prefix_packed_has_causal_attention_flags():
  (row,) = _rows(features.convert(_ds(PAIRS), family="decllm",
                                  task_lengths={"inputs": 7, "targets": 8}))
  assert row == {
      "decoder_target_tokens": [7, 8, 5, 1, 3, 9, 1, 8, 4, 9, 3, 1, 4, 1, 0],
      "decoder_input_tokens": [0, 7, 8, 5, 1, 3, 9, 0, 8, 4, 9, 3, 1, 4, 0],
      "decoder_loss_weights": [0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 0],
      "decoder_segment_ids": [1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 0],
      "decoder_positions": [0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 0],
      # Bidirectional region: the inputs plus the position that reads the last input token.
      "decoder_causal_attention": [1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0],
  }


@pytest.mark.parametrize("continuous", [True, False])
def test_redllm_packed_decoder_positions_continue_from_encoder_length(continuous):
  (row,) = _rows(features.convert(_ds(PAIRS), family="redllm",
                                  task_lengths={"inputs": 10, "targets": 7},
                                  continuous_positions=continuous))
  expected = {
      "encoder_input_tokens": [7, 8, 5, 1, 8, 4, 9, 3, 1, 0],
      "encoder_segment_ids": [1, 1, 1, 1, 2, 2, 2, 2, 2, 0],
      "encoder_positions": [0, 1, 2, 3, 0, 1, 2, 3, 4, 0],
      "decoder_target_tokens": [3, 9, 1, 4, 1, 0, 0],
      "decoder_input_tokens": [0, 3, 9, 0, 4, 0, 0],
      "decoder_loss_weights": [1, 1, 1, 1, 1, 0, 0],
      "decoder_segment_ids": [1, 1, 1, 2, 2, 0, 0],
      # Segment 1 has 4 encoder tokens, segment 2 has 5: decoder positions start there.
      "decoder_positions": [4, 5, 6, 5, 6, 0, 0] if continuous else [0, 1, 2, 0, 1, 0, 0],
  }
  assert row == expected


def test_unpacked_rows_get_segments_and_positions():
  (row,) = _rows(features.convert(_ds(PAIRS[:1]), family="redllm", pack=False,
                                  task_lengths={"inputs": 6, "targets": 5}))
  assert row["encoder_segment_ids"] == [1, 1, 1, 1, 0, 0]
  assert row["encoder_positions"] == [0, 1, 2, 3, 0, 0]
  assert row["decoder_segment_ids"] == [1, 1, 1, 0, 0]
  assert row["decoder_positions"] == [4, 5, 6, 0, 0]
  (row,) = _rows(features.convert(_ds([{"targets": [3, 9, 1]}]), family="decllm", pack=False,
                                  task_lengths={"targets": 5}))
  assert row["decoder_segment_ids"] == [1, 1, 1, 0, 0]
  assert row["decoder_positions"] == [0, 1, 2, 0, 0]


def test_continuous_positions_on_a_batch_with_an_empty_encoder_segment():
  batch = {
      "encoder_segment_ids": np.array([[1, 1, 3, 3, 3, 0], [1, 1, 1, 1, 1, 1]], np.int32),
      # Row 0: segment 2 has no encoder tokens (empty inputs), so it keeps its own positions.
      "decoder_segment_ids": np.array([[1, 2, 2, 3, 3, 0], [1, 1, 1, 1, 0, 0]], np.int32),
      "decoder_positions": np.array([[0, 0, 1, 0, 1, 0], [0, 1, 2, 3, 0, 0]], np.int32),
  }
  out = features.continuous_decoder_positions(batch)
  np.testing.assert_array_equal(out["decoder_positions"],
                                [[2, 0, 1, 3, 4, 0], [6, 7, 8, 9, 0, 0]])


def test_model_feature_lengths_match_converter_output():
  for family, lengths, causal in (("decllm", {"targets": 6}, False),
                                  ("decllm", {"inputs": 7, "targets": 8}, True),
                                  ("redllm", {"inputs": 10, "targets": 7}, False)):
    ds = _ds([{"targets": [3, 9, 1]}]) if "inputs" not in lengths else _ds(PAIRS)
    (row,) = _rows(features.convert(ds, family=family, task_lengths=lengths))
    assert {k: len(v) for k, v in row.items()} == features.model_feature_lengths(
        family, lengths, causal)
