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


def _random_splits(seed, lengths, ilen=6, tlen=6, chunking="document"):
  lens = {"inputs": ilen, "targets": tlen}
  with seqio.utils.map_seed_manager(seed):
    ds = objectives.prefix_lm_random(_docs(lengths), sequence_length=lens,
                                     output_features=FEATURES, chunking=chunking)
  return [(len(e["inputs"]), len(e["targets"])) for e in ds.as_numpy_iterator()]


def _uniform_within(ks, lo, hi, sigmas=5.0):
  """Every point of [lo, hi] drawn about equally often (each count within ``sigmas`` binomial
  standard errors of n / (hi - lo + 1)), and nothing outside."""
  ks = np.asarray(ks)
  assert ks.min() == lo and ks.max() == hi
  n, p = len(ks), 1.0 / (hi - lo + 1)
  counts = np.bincount(ks - lo, minlength=hi - lo + 1)
  assert np.all(np.abs(counts - n * p) <= sigmas * np.sqrt(n * p * (1 - p))), counts


def test_prefix_random_split_is_valid_varied_and_seeded():
  """Chunks of min(I, T) + 1 tokens (7 here): a full chunk splits anywhere in [1, 6], every
  split fits both lengths; a short chunk anywhere in its own range."""
  lengths = [12] * 150 + [3] * 50  # Chunks 7, 6 (doc + EOS = 13 tokens) and 4.
  splits = _random_splits(7, lengths)
  assert len(splits) == 350
  assert all(k <= 6 and m <= 6 and k >= 1 and m >= 1 for k, m in splits)
  assert {k + m for k, m in splits} == {7, 6, 4}
  assert {k for k, m in splits if k + m == 7} == set(range(1, 7))  # Not only the middle.
  assert {k for k, m in splits if k + m == 4} == {1, 2, 3}
  assert _random_splits(7, lengths) == splits
  assert _random_splits(8, lengths) != splits


@pytest.mark.parametrize("ilen, tlen", [(16, 16), (24, 8)])
def test_random_split_is_uniform_over_the_whole_chunk(ilen, tlen):
  """Stream chunking, every chunk full: over 1,200 draws the split is uniform over all of
  [1, L - 1] (L = min(I, T) + 1), the inputs / targets padded to their lengths."""
  chunk = objectives.random_split_chunk(ilen, tlen)
  assert chunk == min(ilen, tlen) + 1
  splits = _random_splits(3, [chunk * 4 - 1] * 300, ilen, tlen, chunking="stream")
  assert len(splits) == 1200 and {k + m for k, m in splits} == {chunk}
  _uniform_within([k for k, _ in splits], 1, chunk - 1)


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_random_split_through_the_pipeline_is_uniform_for_both_families(
    make_cfg, redpajama_root, family):
  """``data.prefix_split=random`` (stream chunking, I = T = 16): every segment is a full chunk of
  17 tokens split uniformly over [1, 16] — DecLLM (bidirectional prefix: the inputs are the
  prefix of the row) and RedLLM (encoder inputs) alike."""
  from t5like.data import pipeline
  cfg = make_cfg(**{"data.mixture": "redpajama_v1", "data.data_dir": redpajama_root[0],
                    "data.validation_dir": redpajama_root[1], "model.family": family,
                    "model.decoder_attention": "prefix" if family == "decllm" else "causal",
                    "data.prefix_split": "random", "data.pretrain_chunking": "stream",
                    "data.inputs_length": 16, "data.targets_length": 16,
                    "data.mixture_rates": '{"c4": 0, "common_crawl": 0, "github": 0, '
                                          '"stackexchange": 0}'})
  it = pipeline.make_iterator(cfg, batch_size=8)
  ks = []
  for _ in range(40):
    b = next(it)
    for r in range(8):
      dseg = b["decoder_segment_ids"][r]
      for s in set(dseg.tolist()) - {0}:
        if family == "redllm":
          k, m = int((b["encoder_segment_ids"][r] == s).sum()), int((dseg == s).sum())
        else:  # The prefix flags cover BOS + the inputs.
          k = int(b["decoder_causal_attention"][r][dseg == s].sum()) - 1
          m = int((dseg == s).sum()) - k
        assert k + m == 17, (k, m)
        ks.append(k)
  assert len(ks) >= 300
  _uniform_within(ks, 1, 16)
