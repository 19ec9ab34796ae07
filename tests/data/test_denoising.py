"""Span corruption (T5) and UL2's denoisers: structure, statistics, seeding, shards, restore."""
import collections

import numpy as np
import pytest
import seqio
import tensorflow as tf

from t5like.config import ConfigError
from t5like.config import spans
from t5like.data import denoising, pipeline, vocab

V = 1000  # Vocabulary of the hand-made tests: sentinels are 999, 998, ...
EXTRA = 100


def _corrupt(tokens, density, mean_span, seed):
  t = tf.constant(tokens, tf.int32)
  mask = denoising.noise_mask(tf.size(t), density, mean_span, tf.constant(seed, tf.int32))
  out = denoising.corrupt(t, mask, V)
  return mask.numpy(), out["inputs"].numpy().tolist(), out["targets"].numpy().tolist()


def splice(inputs, targets, vocab_size=V, extra_ids=EXTRA, eos_id=None):
  """Undo span corruption: each sentinel of the inputs becomes the span after it in the targets
  (``eos_id``: both end in that EOS, T5's layout, which is taken off first)."""
  if eos_id is not None:
    assert inputs[-1] == eos_id and targets[-1] == eos_id, (inputs[-3:], targets[-3:])
    inputs, targets = inputs[:-1], targets[:-1]
  is_sentinel = lambda t: t >= vocab_size - extra_ids  # noqa: E731
  spans_of, current = {}, None
  for t in targets:
    if is_sentinel(t):
      current = t
      spans_of[t] = []
    else:
      spans_of[current].append(t)
  out = []
  for t in inputs:
    out.extend(spans_of.pop(t) if is_sentinel(t) else [t])
  assert not spans_of, "every target span is used once"
  return out


@pytest.mark.parametrize("length, density, mean_span", [
    (30, 0.15, 3.0), (100, 0.15, 3.0), (64, 0.5, 8.0), (7, 0.15, 3.0), (2, 0.15, 3.0),
    (200, 0.5, 32.0)])
def test_sentinels_count_down_spans_never_touch_and_splicing_restores_the_text(
    length, density, mean_span):
  tokens = list(range(10, 10 + length))
  for seed in range(20):
    mask, inputs, targets = _corrupt(tokens, density, mean_span, [seed, 3])
    noise, n_spans = spans.span_counts(length, density, mean_span)
    assert mask.sum() == noise
    starts = np.flatnonzero(mask & ~np.concatenate([[False], mask[:-1]]))
    assert len(starts) == n_spans
    assert not mask[0] and mask[-1]  # Clean first, noise last (T5's layout).
    sentinels = [t for t in inputs if t >= V - EXTRA]
    assert sentinels == list(range(V - 1, V - 1 - n_spans, -1))  # 999, 998, ... in order.
    assert [t for t in targets if t >= V - EXTRA] == sentinels
    assert targets[0] == V - 1
    # No two noise spans adjacent: a sentinel is never followed by another sentinel.
    for seq in (inputs, targets):
      assert all(not (a >= V - EXTRA and b >= V - EXTRA) for a, b in zip(seq, seq[1:]))
    assert len(inputs) == length - noise + n_spans and len(targets) == noise + n_spans
    assert splice(inputs, targets) == tokens


def test_noise_density_and_mean_span_length_over_many_draws():
  """Counts are exact (round(L*d), round(noise/mu)); the spans' placement is random: over 400
  draws every inner position is noise with probability ~ the density and the first span's
  length averages noise/spans (a uniform split), each within 5 standard errors."""
  length, density, mean_span, draws = 120, 0.15, 3.0, 400
  noise, n_spans = spans.span_counts(length, density, mean_span)
  assert abs(noise / length - density) <= 0.5 / length
  assert noise / n_spans == pytest.approx(mean_span, abs=0.5)
  masks, first_spans, all_spans = [], [], []
  for seed in range(draws):
    mask, _, _ = _corrupt(list(range(10, 10 + length)), density, mean_span, [seed, 11])
    masks.append(mask)
    runs = np.diff(np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]]))))[::2]
    first_spans.append(runs[0])
    all_spans.extend(runs)
  assert np.mean(all_spans) == pytest.approx(noise / n_spans)  # Exact: noise/spans per draw.
  inner = np.mean(masks, axis=0)[length // 4: 3 * length // 4]
  se = np.sqrt(density * (1 - density) / draws)
  assert np.all(np.abs(inner - noise / length) < 5 * se + 0.02)
  assert abs(np.mean(inner) - noise / length) < 5 * se / np.sqrt(len(inner)) + 0.01
  sd = np.std(first_spans) / np.sqrt(draws)
  assert abs(np.mean(first_spans) - noise / n_spans) < 5 * sd
  assert len(set(first_spans)) > 3  # Span lengths vary (not all equal to the mean).


def test_same_seed_same_corruption_other_seed_other():
  tokens = list(range(10, 90))
  a = _corrupt(tokens, 0.15, 3.0, [5, 1])
  assert _corrupt(tokens, 0.15, 3.0, [5, 1])[1:] == a[1:]
  assert _corrupt(tokens, 0.15, 3.0, [6, 1])[1:] != a[1:]


@pytest.mark.parametrize("ilen, tlen", [(512, 114), (64, 16), (1024, 1024), (40, 12)])
def test_chunk_length_fits_inputs_and_targets(ilen, tlen):
  length = spans.span_chunk_length(ilen, tlen, 0.15, 3.0)
  for n in range(2, length + 1):
    i, t = spans.corrupted_lengths(n, 0.15, 3.0)
    assert i <= ilen and t <= tlen
  i, t = spans.corrupted_lengths(length + 1, 0.15, 3.0)
  assert i > ilen or t > tlen  # The longest such chunk.
  if (ilen, tlen) == (512, 114):
    assert length == 568 and spans.corrupted_lengths(568, 0.15, 3.0) == (512, 114)  # T5's.


def t5_random_spans_helper(inputs_length, noise_density, mean_noise_span_length):
  """T5's ``random_spans_helper`` (t5.data.preprocessors) written from its definition: the
  longest chunk whose inputs (clean tokens + a sentinel per span + EOS) fit ``inputs_length``,
  and its targets length (noise tokens + a sentinel per span + EOS); Python (float64) rounding."""
  def lengths(n):
    noise = int(round(n * noise_density))
    n_spans = int(round(noise / mean_noise_span_length))
    return n - noise + n_spans + 1, noise + n_spans + 1
  n = inputs_length - 1
  while lengths(n + 1)[0] <= inputs_length:
    n += 1
  return n, lengths(n)[1]


@pytest.mark.parametrize("density, mean_span", [(0.15, 3.0), (0.15, 8.0)])
def test_chunk_lengths_are_random_spans_helpers(density, mean_span):
  """With the targets length T5's helper derives, the chunk and both lengths are the helper's
  (568 -> 512 / 114 at T5's 512, 0.15, 3), EOS included, at inputs lengths 64..600 where
  float32 and float64 round the chunk alike. (Not at mean span 64: there the helper counts
  round(noise / 64) = 0 spans for short chunks where T5's mask makes at least one.)"""
  assert t5_random_spans_helper(512, 0.15, 3.0) == (568, 114)
  checked = 0
  for ilen in range(64, 601, 7):
    tokens, tlen = t5_random_spans_helper(ilen, density, mean_span)
    if any(round(n * density) != spans.span_counts(n, density, mean_span)[0]
           for n in (tokens, tokens + 1)):
      continue  # A float32/float64 tie at the chunk (test_float32_rounding_as_t5s_mask).
    checked += 1
    assert spans.span_chunk_length(ilen, tlen, density, mean_span) == tokens, ilen
    assert spans.corrupted_lengths(tokens, density, mean_span) == (ilen, tlen), ilen
  assert checked >= 10


def test_float32_rounding_as_t5s_mask():
  """T5's ``random_spans_noise_mask`` rounds ``length * density`` in float32: 190 x 0.15 is
  28.5000011 there (29 noise tokens), 28.499999999999996 in float64 (28). t5like follows the
  mask, in its length arithmetic and in its own mask."""
  assert spans.span_counts(190, 0.15, 3.0)[0] == 29 != round(190 * 0.15)
  mask, _, _ = _corrupt(list(range(10, 200)), 0.15, 3.0, [0, 1])
  assert mask.sum() == 29
  for n in (40, 100, 568, 1000):
    want = int(np.round(np.float32(n) * np.float32(0.15)))
    assert _corrupt(list(range(10, 10 + n)), 0.15, 3.0, [1, 2])[0].sum() == want


FEATURES = {k: seqio.Feature(seqio.PassThroughVocabulary(size=V, eos_id=1)) for k in
            ("inputs", "targets")}


def test_span_corruption_preprocessor_on_documents():
  docs = tf.data.Dataset.from_tensor_slices(
      {"targets": tf.ragged.constant([list(range(10, 10 + n)) for n in (50, 7, 90)],
                                     dtype=tf.int32)})
  lengths = {"inputs": 24, "targets": 8}
  with seqio.utils.map_seed_manager(3):
    ds = denoising.span_corruption(docs, lengths, FEATURES, chunking="stream")
  out = list(ds.as_numpy_iterator())
  chunk = spans.span_chunk_length(24, 8, 0.15, 3.0)
  stream = [t for n in (50, 7, 90) for t in list(range(10, 10 + n)) + [1]]
  assert len(out) == len(stream) // chunk
  restored = []
  for ex in out:
    assert len(ex["inputs"]) <= 24 and len(ex["targets"]) <= 8
    restored += splice(ex["inputs"].tolist(), ex["targets"].tolist())
  assert restored == stream[:len(restored)]


# ---- Through the pipeline: sentinel ids in the vocabulary, shards, restore, UL2 mixing. ----

def _cfg(make_cfg, redpajama_root, spm_path, objective="span_corruption", **kw):
  size = vocab.vocab_size(spm_path) + EXTRA
  return make_cfg(**{"data.mixture": "redpajama_v1", "data.data_dir": redpajama_root[0],
                     "data.validation_dir": redpajama_root[1],
                     "data.mixture_rates": '{"c4": 0, "common_crawl": 0, "github": 0, '
                                           '"stackexchange": 0}',
                     "data.objective": objective, "data.extra_ids": EXTRA,
                     "data.vocab_path": spm_path,
                     "model.vocab_size": size, "model.family": "redllm",
                     "data.inputs_length": 32, "data.targets_length": 16, **kw})


def _originals(cfg, **kw):
  """Every packed segment of one pass, spliced back to the text it corrupts."""
  out = []
  size = cfg.model.vocab_size
  for b in pipeline.make_iterator(cfg, batch_size=4, repeat=False, **kw):
    for r in range(b["decoder_segment_ids"].shape[0]):
      dseg, eseg = b["decoder_segment_ids"][r], b["encoder_segment_ids"][r]
      for s in set(dseg.tolist()) - {0}:
        out.append(tuple(splice(b["encoder_input_tokens"][r][eseg == s].tolist(),
                                b["decoder_target_tokens"][r][dseg == s].tolist(), size,
                                eos_id=1)))
  return out


def test_pipeline_shards_are_disjoint_and_splice_back_to_the_corpus(
    make_cfg, redpajama_root, spm_path):
  cfg = _cfg(make_cfg, redpajama_root, spm_path)
  full = collections.Counter(_originals(cfg, shuffle=False))
  s0 = collections.Counter(_originals(cfg, shard_index=0, num_shards=2))
  s1 = collections.Counter(_originals(cfg, shard_index=1, num_shards=2))
  assert len(full) > 50
  assert not set(s0) & set(s1)
  assert s0 + s1 == full


@pytest.mark.slow  # make test's 15-minute budget on 2 cores (docs/tests.md)
def test_pipeline_restore_mid_stream_gives_the_uninterrupted_batches(
    make_cfg, redpajama_root, spm_path, tmp_path):
  cfg = _cfg(make_cfg, redpajama_root, spm_path, **{"data.pretrain_chunking": "stream"})
  it = pipeline.make_iterator(cfg, batch_size=3, shard_index=1, num_shards=2)
  for _ in range(4):
    next(it)
  it.save(str(tmp_path / "ckpt"))
  expected = [next(it) for _ in range(5)]
  fresh = pipeline.make_iterator(cfg, batch_size=3, shard_index=1, num_shards=2)
  next(fresh)
  fresh.restore(str(tmp_path / "ckpt"))
  got = [next(fresh) for _ in range(5)]
  assert all(np.array_equal(g[k], e[k]) for g, e in zip(got, expected) for k in e)
  again = [next(pipeline.make_iterator(cfg, batch_size=3, shard_index=1, num_shards=2))]
  assert np.array_equal(again[0]["encoder_input_tokens"],
                        next(pipeline.make_iterator(cfg, batch_size=3, shard_index=1,
                                                    num_shards=2))["encoder_input_tokens"])


def test_a_vocabulary_without_sentinels_is_refused_at_config_time(make_cfg, redpajama_root,
                                                                  spm_path):
  with pytest.raises(ConfigError, match=r"needs \d+ reserved ids .* data.extra_ids=0"):
    _cfg(make_cfg, redpajama_root, spm_path, **{"data.extra_ids": 0})
  with pytest.raises(ConfigError, match=r"mode tokens"):
    _cfg(make_cfg, redpajama_root, spm_path, objective="ul2", **{"data.extra_ids": 4})
  # Sentinels without the model's ids for them: the start-up vocabulary check names both.
  from t5like.data import checks
  cfg = _cfg(make_cfg, redpajama_root, spm_path, **{"model.vocab_size": 300})
  with pytest.raises(ConfigError, match=r"extra_ids=100 sentinels has \d+ ids"):
    checks.check_data(cfg, evaluate=False)


UL2 = ('{"r": {"mode": "r", "noise_density": 0.15, "mean_noise_span_length": 3, "rate": 2}, '
       '"x": {"mode": "x", "noise_density": 0.5, "mean_noise_span_length": 8, "rate": 1}, '
       '"s": {"mode": "s", "rate": 1}}')


def test_ul2_mode_tokens_mixture_rates_and_denoiser_statistics(make_cfg, redpajama_root,
                                                               spm_path):
  """Rates 2:1:1 -> 50/25/25 % of examples; with n examples each share is within 4.5 binomial
  standard errors. Each span denoiser's examples have its noise fraction and mean span length."""
  cfg = _cfg(make_cfg, redpajama_root, spm_path, objective="ul2",
             **{"data.ul2_denoisers": UL2, "data.pretrain_chunking": "stream",
                "data.inputs_length": 48, "data.targets_length": 48})
  size = cfg.model.vocab_size
  modes = {denoising.mode_token_id(size, EXTRA, m): m for m in "rxs"}
  assert sorted(modes) == [size - EXTRA, size - EXTRA + 1, size - EXTRA + 2]
  counts, noise = collections.Counter(), collections.defaultdict(list)
  it = pipeline.make_iterator(cfg, batch_size=8)
  for _ in range(60):
    b = next(it)
    for r in range(8):
      eseg, dseg = b["encoder_segment_ids"][r], b["decoder_segment_ids"][r]
      for s in set(dseg.tolist()) - {0}:
        enc = b["encoder_input_tokens"][r][eseg == s].tolist()
        dec = b["decoder_target_tokens"][r][dseg == s].tolist()
        assert enc[-1] == 1 and dec[-1] == 1  # EOS after both (T5's layout), S included.
        enc, dec = enc[:-1], dec[:-1]
        mode = modes[enc[0]]  # Every example starts with its denoiser's mode token.
        assert not any(t in modes for t in enc[1:] + dec)
        counts[mode] += 1
        if mode != "s":
          n_spans = sum(t >= size - EXTRA for t in dec)
          n_noise = len(dec) - n_spans
          noise[mode].append((n_noise, len(enc) - 1 - n_spans + n_noise, n_spans))
  total = sum(counts.values())
  for mode, share in (("r", 0.5), ("x", 0.25), ("s", 0.25)):
    assert abs(counts[mode] / total - share) < 4.5 * np.sqrt(share * (1 - share) / total)
  for mode, density, mean_span in (("r", 0.15, 3), ("x", 0.5, 8)):
    n_noise, length, n_spans = map(np.array, zip(*noise[mode]))
    assert np.all(np.abs(n_noise / length - density) <= 0.5 / length + 1e-9)
    assert np.sum(n_noise) / np.sum(n_spans) == pytest.approx(mean_span, rel=0.2)


def test_build_vocab_reserves_extra_ids_and_the_check_holds_runs_to_them(
    tmp_path, make_cfg, redpajama_root):
  import sentencepiece as spm

  from t5like.data import checks
  from t5like.tools import build_vocab
  pattern = str(vocab.EMBEDDED_DIR / "flan" / "*" / "devils_dictionary_define" / "train.*")
  model = build_vocab.main(["--input", pattern, "--field", "inputs,targets", "--vocab_size",
                            "600", "--extra_ids", "20", "--output_prefix",
                            str(tmp_path / "spm")])
  assert spm.SentencePieceProcessor(model_file=str(model)).get_piece_size() == 580
  assert vocab.recorded_extra_ids(str(model)) == 20
  assert vocab.get_vocabulary(str(model), extra_ids=20).vocab_size == 600
  cfg = _cfg(make_cfg, redpajama_root, str(model), **{"data.extra_ids": 20,
                                                      "model.vocab_size": 600})
  checks.check_data(cfg, evaluate=False)  # The recorded count and the model size agree.
  cfg = _cfg(make_cfg, redpajama_root, str(model), **{"data.extra_ids": 30,
                                                      "model.vocab_size": 610})
  with pytest.raises(ConfigError, match=r"built with --extra_ids 20 .*config.data.extra_ids=20"):
    checks.check_data(cfg, evaluate=False)


def test_existing_vocabularies_keep_their_size_without_extra_ids(make_cfg, redpajama_root,
                                                                spm_path):
  from t5like.data import checks
  assert vocab.recorded_extra_ids("") is None and vocab.recorded_extra_ids(spm_path) is None
  size = vocab.vocab_size(spm_path)
  cfg = make_cfg(**{"data.mixture": "redpajama_v1", "data.data_dir": redpajama_root[0]})
  assert cfg.data.extra_ids == 0 and cfg.model.vocab_size == size
  checks.check_data(cfg, evaluate=False)
  assert vocab.get_vocabulary("").vocab_size == vocab.EMBEDDED_VOCAB_SIZE
  assert vocab.get_vocabulary("", extra_ids=vocab.T5_EXTRA_IDS).vocab_size == 8292


def test_extra_eval_sets_use_the_same_vocabulary_with_sentinels(make_cfg, redpajama_root,
                                                                 spm_path):
  import json
  import os

  from t5like.training.data import PipelineData
  cfg = _cfg(make_cfg, redpajama_root, spm_path, **{
      "data.extra_eval": json.dumps({"wiki": os.path.join(redpajama_root[1], "wikipedia")})})
  (name, it), = PipelineData(cfg, check=False).extra_evals(4, 0, 1).items()
  batch = next(it)
  assert name == "wiki" and batch["decoder_target_tokens"].max() < cfg.model.vocab_size


def test_s_denoiser_splits_anywhere_in_its_chunk():
  """UL2's S-denoiser: chunks of min(I - 2, T - 1) + 1 tokens (the mode token and EOS take their
  places), split uniformly over the whole chunk (1,000 draws: every point within 5 binomial
  standard errors of its share), the S mode token first."""
  ilen, tlen = 14, 11
  chunk = min(ilen - 2, tlen - 1) + 1
  docs = tf.data.Dataset.from_tensor_slices(
      {"targets": tf.ragged.constant([list(range(10, 10 + 4 * chunk - 1))] * 250, tf.int32)})
  with seqio.utils.map_seed_manager(5):
    ds = denoising.prefix_lm_denoiser(docs, {"inputs": ilen, "targets": tlen}, FEATURES,
                                      chunking="stream")
  out = list(ds.as_numpy_iterator())
  assert len(out) == 1000
  s_token = denoising.mode_token_id(V, 0, "s")
  ks = []
  for ex in out:
    assert ex["inputs"][0] == s_token
    k, m = len(ex["inputs"]) - 1, len(ex["targets"])
    assert k + m == chunk and k + 2 <= ilen and m + 1 <= tlen
    ks.append(k)
  counts = np.bincount(ks, minlength=chunk)[1:]
  n, p = len(ks), 1 / (chunk - 1)
  assert np.all(np.abs(counts - n * p) <= 5 * np.sqrt(n * p * (1 - p))), counts


def test_ul2_default_is_the_papers_seven_denoisers():
  """data.objective=ul2: UL2's seven (R 3/8 at 15 %, X 3/8 at 50 %, X 64 at 15 / 50 %, S) by
  default at 20 % R / 10 % X each / 20 % S (R, X 40 % each, S 20 %); the earlier three under
  data.ul2_preset=three."""
  from t5like.config.data import DataConfig
  seven = DataConfig(objective="ul2", extra_ids=100, inputs_length=512, targets_length=114)
  got = {(d["mode"], d.get("mean_noise_span_length") if d["mode"] != "s" else None,
          d.get("noise_density") if d["mode"] != "s" else None)
         for d in seven.denoisers().values()}
  assert got == {("r", 3.0, 0.15), ("r", 8.0, 0.15), ("x", 3.0, 0.5), ("x", 8.0, 0.5),
                 ("x", 64.0, 0.15), ("x", 64.0, 0.5), ("s", None, None)}
  share = {}
  for d in seven.denoisers().values():
    share[d["mode"], d.get("mean_noise_span_length"), d.get("noise_density")] = d["rate"]
  total = sum(share.values())
  by_mode = {m: sum(r for (mode, _, _), r in share.items() if mode == m) / total for m in "rxs"}
  assert by_mode == pytest.approx({"r": 0.4, "x": 0.4, "s": 0.2})
  assert len({r for (mode, _, _), r in share.items() if mode == "r"}) == 1  # Equal within R, X.
  assert len({r for (mode, _, _), r in share.items() if mode == "x"}) == 1
  three = DataConfig(objective="ul2", extra_ids=100, ul2_preset="three", inputs_length=512,
                     targets_length=114).denoisers()
  assert {(d["mode"], d["rate"]) for d in three.values()} == {("r", 0.4), ("x", 0.4), ("s", 0.2)}
  with pytest.raises(ConfigError, match="ul2_preset"):
    DataConfig(objective="ul2", extra_ids=100, ul2_preset="nope").validate()
