"""t5like's span corruption against `t5.data.preprocessors` (Raffel et al.'s own code).

* Given the same noise mask, the inputs and targets are byte-for-byte T5's
  (``noise_span_to_unique_sentinel`` / ``nonnoise_span_to_unique_sentinel``).
* For every chunk length the masks have T5's numbers of noise tokens and spans (float32
  rounding, as T5's mask) and T5's layout (clean first, noise last); the chunk and lengths are
  ``random_spans_helper``'s (568 -> 512 / 114, EOS included).
* The masks themselves are drawn with other random ops, so they are equal only in distribution:
  the per-position noise rate over many seeds agrees with T5's within 5 standard errors.
"""
import numpy as np
import pytest
import tensorflow as tf
from t5.data import preprocessors as t5p

from t5like.config import spans
from t5like.data import denoising

V = 1000  # Sentinels 999, 998, ... (T5: the top of the vocabulary, counting down).
SETTINGS = [(0.15, 3.0), (0.5, 3.0), (0.15, 8.0), (0.5, 32.0)]  # T5 / UL2's R and X denoisers.


class _Vocab:
  vocab_size = V


def _masks(density, mean_span):
  """(T5's mask, t5like's mask) as functions of (length, seed), traced once per setting."""
  sig = [tf.TensorSpec([], tf.int32), tf.TensorSpec([2], tf.int32)]

  @tf.function(input_signature=sig)
  def t5(length, seed):
    seeds = tf.random.experimental.stateless_split(seed, 2)
    return t5p.random_spans_noise_mask(length, density, seeds, mean_span)

  @tf.function(input_signature=sig)
  def ours(length, seed):
    return denoising.noise_mask(length, density, mean_span, seed)

  return (lambda n, s: t5(n, tf.constant(s, tf.int32)).numpy(),
          lambda n, s: ours(n, tf.constant(s, tf.int32)).numpy())


def _starts(mask):
  return int((mask & ~np.concatenate([[False], mask[:-1]])).sum())


@pytest.mark.parametrize("density, mean_span", SETTINGS)
def test_same_mask_gives_t5s_inputs_and_targets_byte_for_byte(density, mean_span):
  rng = np.random.default_rng(0)
  t5_mask, _ = _masks(density, mean_span)
  for length in (2, 7, 30, 105, 200):
    tokens = tf.constant(rng.integers(3, V - 100, length), tf.int32)
    for seed in range(10):
      mask = tf.constant(t5_mask(length, [seed, 7]))
      ours = denoising.corrupt(tokens, mask, V)
      inputs = t5p.noise_span_to_unique_sentinel(tokens, mask, _Vocab, None)
      targets = t5p.nonnoise_span_to_unique_sentinel(tokens, mask, _Vocab, None)
      assert ours["inputs"].dtype == inputs.dtype and ours["targets"].dtype == targets.dtype
      assert ours["inputs"].numpy().tobytes() == inputs.numpy().tobytes()
      assert ours["targets"].numpy().tobytes() == targets.numpy().tobytes()


def _counts(length, density, mean_span, dtype):
  """(noise tokens, spans) by T5's formulas, rounding half to even in ``dtype``."""
  noise = int(np.round(dtype(length) * dtype(density)))
  noise = min(max(noise, 1), length - 1)
  return noise, max(int(np.round(dtype(noise) / dtype(mean_span))), 1)


@pytest.mark.parametrize("density, mean_span", SETTINGS)
def test_noise_and_span_counts_and_layout_equal_t5s(density, mean_span):
  """T5's mask rounds in float32 and so does t5like (its mask and `t5like.config.spans`): the
  counts agree at every length, ties included (190 x 0.15: 29 noise tokens in both)."""
  t5_mask, our_mask = _masks(density, mean_span)
  for length in range(2, 600):
    t5, ours = t5_mask(length, [1, 2]), our_mask(length, [1, 2])
    assert (t5.sum(), _starts(t5)) == _counts(length, density, mean_span, np.float32), length
    assert (ours.sum(), _starts(ours)) == (t5.sum(), _starts(t5)), length
    assert (ours[0], ours[-1]) == (t5[0], t5[-1]) == (False, True), length


def test_span_corruption_lengths_are_t5s():
  """T5's own helper at T5's setting: 568-token chunks, 114 targets, EOS counted; t5like's
  chunk and lengths are the same."""
  tokens, targets = t5p.random_spans_helper(512, 0.15, 3.0, extra_tokens_per_span_inputs=1,
                                            extra_tokens_per_span_targets=1)
  assert (tokens, targets) == (568, 114)
  assert spans.span_chunk_length(512, 114, 0.15, 3.0) == tokens
  assert spans.corrupted_lengths(tokens, 0.15, 3.0) == (512, targets)


@pytest.mark.parametrize("density, mean_span", [(0.15, 3.0), (0.5, 8.0)])
def test_masks_have_t5s_distribution(density, mean_span):
  length, draws = 40, 1500
  t5_mask, our_mask = _masks(density, mean_span)
  t5 = np.mean([t5_mask(length, [s, 11]) for s in range(draws)], axis=0)
  ours = np.mean([our_mask(length, [s, 11]) for s in range(draws)], axis=0)
  se = np.sqrt((t5 * (1 - t5) + ours * (1 - ours)) / draws) + 1e-12
  assert np.all(np.abs(t5 - ours) <= 5 * se + 1e-9), np.abs(t5 - ours) / se
