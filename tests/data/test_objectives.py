"""Objectives: document chunking, prefix split sizes (middle and random), seeded randomness."""
import numpy as np
import pytest
import seqio
import tensorflow as tf

from t5like.data import objectives

FEATURES = {"targets": seqio.Feature(seqio.PassThroughVocabulary(size=1000, eos_id=1))}


def _docs(lengths):
  return tf.data.Dataset.from_tensor_slices(
      {"targets": tf.ragged.constant([list(range(10, 10 + n)) for n in lengths], dtype=tf.int32)})


def _lists(ds, key="targets"):
  return [ex[key].numpy().tolist() for ex in ds]


def test_causal_chunks_documents_with_eos_and_keeps_every_token():
  ds = objectives.causal_lm(_docs([10, 3]), sequence_length={"targets": 4},
                            output_features=FEATURES)
  assert _lists(ds) == [[10, 11, 12, 13], [14, 15, 16, 17], [18, 19, 1], [10, 11, 12, 1]]


@pytest.mark.parametrize("ilen, tlen, doc, expected", [
    # Paper setting (equal lengths): chunks of 8 split 4/4; the 4-token tail splits 2/2.
    (4, 4, 11, [(4, 4), (2, 2)]),
    # Unequal lengths: the split keeps the I:T proportion (6/2 of 8, 3/1 of 4).
    (6, 2, 11, [(6, 2), (3, 1)]),
    # A 2-token tail still gives one input and one target token; 1-token tails are dropped.
    (4, 4, 9, [(4, 4), (1, 1)]),
    (4, 4, 8, [(4, 4)]),
])
def test_prefix_middle_split_sizes(ilen, tlen, doc, expected):
  ds = objectives.prefix_lm_middle(_docs([doc]), sequence_length={"inputs": ilen, "targets": tlen},
                                   output_features=FEATURES)
  got = [(len(e["inputs"]), len(e["targets"])) for e in ds.as_numpy_iterator()]
  assert got == expected
  tokens = [t for e in ds.as_numpy_iterator() for t in list(e["inputs"]) + list(e["targets"])]
  assert tokens == (list(range(10, 10 + doc)) + [1])[:len(tokens)]


def _random_splits(seed, lengths, ilen=6, tlen=6):
  lens = {"inputs": ilen, "targets": tlen}
  with seqio.utils.map_seed_manager(seed):
    ds = objectives.chunk_for_prefix_lm(_docs(lengths), sequence_length=lens,
                                        output_features=FEATURES)
    ds = objectives._random_split(ds, sequence_length=lens)  # pylint: disable=protected-access
  return [(len(e["inputs"]), len(e["targets"])) for e in ds.as_numpy_iterator()]


def test_prefix_random_split_is_valid_varied_and_seeded():
  lengths = [11] * 200 + [4] * 50  # Chunks of 12 (doc + EOS) and 5.
  splits = _random_splits(7, lengths)
  assert len(splits) == 250
  for k, m in splits:
    total = k + m
    assert max(1, total - 6) <= k <= min(total - 1, 6)
  full = [k for k, m in splits if k + m == 12]
  assert set(full) == {6}  # A full chunk of I+T fits only at the middle.
  short = [k for k, m in splits if k + m == 5]
  assert set(short) == {1, 2, 3, 4}  # Every valid point of a short chunk occurs.
  assert _random_splits(7, lengths) == splits
  assert _random_splits(8, lengths) != splits


def test_random_split_covers_range_for_long_budgets():
  splits = _random_splits(3, [19] * 300, ilen=16, tlen=16)  # Chunks of 20: k in [4, 16].
  ks = np.array([k for k, _ in splits])
  assert ks.min() == 4 and ks.max() == 16 and len(set(ks)) == 13
