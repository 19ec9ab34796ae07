"""Each denoising objective x model family builds the right packed features (checked by hand).

Two span-corrupted examples (vocabulary of 100 ids: sentinels 99, 98):
  A = 10 11 12 13 14 with 11 12 and 14 corrupted: inputs 10 99 13 98, targets 99 11 12 98 14
  B = 20 21 22 with 22 corrupted:                 inputs 20 21 99,    targets 99 22
"""
import pytest
import tensorflow as tf

from t5like.data import denoising, features

V = 100


def _examples():
  out = []
  for tokens, mask in (([10, 11, 12, 13, 14], [0, 1, 1, 0, 1]), ([20, 21, 22], [0, 0, 1])):
    ex = denoising.corrupt(tf.constant(tokens), tf.constant([m == 1 for m in mask]), V)
    out.append({k: v.numpy().tolist() for k, v in ex.items()})
  return out


def _row(family, lengths, **kw):
  ex = _examples()
  ds = tf.data.Dataset.from_tensor_slices(
      {k: tf.ragged.constant([e[k] for e in ex], dtype=tf.int32) for k in ("inputs", "targets")})
  (row,) = [{k: v.numpy().tolist() for k, v in r.items()}
            for r in features.convert(ds, family=family, task_lengths=lengths, **kw)]
  return row


def test_the_hand_made_examples():
  assert _examples() == [{"inputs": [10, 99, 13, 98], "targets": [99, 11, 12, 98, 14]},
                         {"inputs": [20, 21, 99], "targets": [99, 22]}]


def test_encoder_decoder_inputs_to_encoder_targets_to_decoder_continuous_positions():
  assert _row("redllm", {"inputs": 8, "targets": 8}) == {
      "encoder_input_tokens": [10, 99, 13, 98, 20, 21, 99, 0],
      "encoder_segment_ids": [1, 1, 1, 1, 2, 2, 2, 0],
      "encoder_positions": [0, 1, 2, 3, 0, 1, 2, 0],
      "decoder_target_tokens": [99, 11, 12, 98, 14, 99, 22, 0],
      "decoder_input_tokens": [0, 99, 11, 12, 98, 0, 99, 0],
      "decoder_loss_weights": [1, 1, 1, 1, 1, 1, 1, 0],
      "decoder_segment_ids": [1, 1, 1, 1, 1, 2, 2, 0],
      # Decoder positions continue after each example's encoder length (4, then 3).
      "decoder_positions": [4, 5, 6, 7, 8, 3, 4, 0],
  }


DECODER = {
    "decoder_target_tokens": [10, 99, 13, 98, 99, 11, 12, 98, 14, 20, 21, 99, 99, 22, 0, 0],
    "decoder_input_tokens": [0, 10, 99, 13, 98, 99, 11, 12, 98, 0, 20, 21, 99, 99, 0, 0],
    "decoder_segment_ids": [1] * 9 + [2] * 5 + [0, 0],
    "decoder_positions": list(range(9)) + list(range(5)) + [0, 0],
    # The bidirectional region of a non-causal decoder: the inputs and the position reading the
    # last input token (a causal decoder ignores it).
    "decoder_causal_attention": [1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0],
}


@pytest.mark.parametrize("loss_on_inputs, weights", [
    (False, [0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 0, 0]),  # Non-causal / causal, targets.
    (True, [1] * 14 + [0, 0]),  # Causal decoder, loss on every token (Wang et al.'s full LM).
])
def test_decoder_only_rows_inputs_then_targets(loss_on_inputs, weights):
  row = _row("decllm", {"inputs": 8, "targets": 8}, loss_on_inputs=loss_on_inputs)
  assert row == {**DECODER, "decoder_loss_weights": weights}


def test_loss_on_inputs_leaves_the_encoder_decoder_alone():
  assert (_row("redllm", {"inputs": 8, "targets": 8}, loss_on_inputs=True)
          == _row("redllm", {"inputs": 8, "targets": 8}))
