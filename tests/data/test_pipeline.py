"""Iterator behaviour: sharding, determinism, exact save/restore, shapes, padding, split sizes."""
import collections
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from t5like.data import pipeline

ONLY_3 = ('{"c4": 0, "common_crawl": 0, "github": 0, "stackexchange": 0}')


def _rp(make_cfg, root, **kw):
  return make_cfg(**{"data.mixture": "redpajama_v1", "data.data_dir": root[0],
                     "data.validation_dir": root[1], "data.mixture_rates": ONLY_3, **kw})


def _flan(make_cfg, root, **kw):
  return make_cfg(**{"data.mixture": "flan", "data.data_dir": root, "data.inputs_length": 64,
                     **kw})


def _segments(cfg, **kw):
  """Every packed segment of one pass, as (encoder tokens, decoder tokens) tuples."""
  out = []
  for b in pipeline.make_iterator(cfg, batch_size=4, repeat=False, **kw):
    enc = b.get("encoder_input_tokens")
    for r in range(b["decoder_segment_ids"].shape[0]):
      dseg = b["decoder_segment_ids"][r]
      for s in set(dseg.tolist()) - {0}:
        dec = tuple(b["decoder_target_tokens"][r][dseg == s])
        e = tuple(enc[r][b["encoder_segment_ids"][r] == s]) if enc is not None else ()
        out.append((e, dec))
  return out


@pytest.mark.parametrize("corpus", ["redpajama", pytest.param("flan", marks=pytest.mark.slow)])  # Budget: docs/tests.md
def test_two_shards_are_disjoint_and_cover_the_data(make_cfg, redpajama_root, flan_root, corpus):
  # redpajama: 2 files per subset -> whole files per shard; flan: 1 file per task -> examples.
  cfg = (_rp(make_cfg, redpajama_root, **{"data.sequence_length": 256}) if corpus == "redpajama"
         else _flan(make_cfg, flan_root, **{"model.family": "redllm"}))
  full = collections.Counter(_segments(cfg, shuffle=False))
  s0 = collections.Counter(_segments(cfg, shuffle=True, shard_index=0, num_shards=2))
  s1 = collections.Counter(_segments(cfg, shuffle=True, shard_index=1, num_shards=2))
  assert len(full) > 50 and sum(full.values()) == len(full)  # Every example is distinct.
  assert not set(s0) & set(s1)
  assert s0 + s1 == full
  assert abs(sum(s0.values()) - sum(s1.values())) < 0.35 * sum(full.values())


def _take(it, n):
  return [next(it) for _ in range(n)]


def _same(a, b):
  return len(a) == len(b) and all(
      x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x) for x, y in zip(a, b))


def test_same_seed_same_batches_other_seed_other_batches(make_cfg, redpajama_root):
  cfg = _rp(make_cfg, redpajama_root, **{"model.family": "redllm", "data.prefix_split": "random"})
  a = _take(pipeline.make_iterator(cfg, batch_size=4), 4)
  b = _take(pipeline.make_iterator(cfg, batch_size=4), 4)
  assert _same(a, b)
  cfg.data.seed = 1
  c = _take(pipeline.make_iterator(cfg, batch_size=4), 4)
  assert not _same(a, c)


@pytest.mark.parametrize("family, corpus", [("redllm", "redpajama"), ("decllm", "flan")])
def test_restore_gives_the_batches_of_an_uninterrupted_run(make_cfg, redpajama_root, flan_root,
                                                            tmp_path, family, corpus):
  cfg = (_rp(make_cfg, redpajama_root, **{"model.family": family, "data.prefix_split": "random"})
         if corpus == "redpajama" else _flan(make_cfg, flan_root, **{"model.family": family}))
  it = pipeline.make_iterator(cfg, batch_size=3, shard_index=1, num_shards=2)
  _take(it, 5)
  it.save(str(tmp_path / "ckpt"))
  expected = _take(it, 6)
  fresh = pipeline.make_iterator(cfg, batch_size=3, shard_index=1, num_shards=2)
  first = _take(fresh, 1)
  fresh.restore(str(tmp_path / "ckpt"))
  assert fresh.batches_read == 5
  got = _take(fresh, 6)
  assert _same(got, expected)
  assert not _same(first, expected[:1])


def test_restore_refuses_other_settings_and_missing_state(make_cfg, redpajama_root, tmp_path):
  cfg = _rp(make_cfg, redpajama_root)
  it = pipeline.make_iterator(cfg, batch_size=2)
  next(it)
  it.save(str(tmp_path / "c"))
  cfg.data.sequence_length = 64
  other = pipeline.make_iterator(cfg, batch_size=2)
  with pytest.raises(ValueError, match=r"data.sequence_length: 32 -> 64"):
    other.restore(str(tmp_path / "c"))
  with pytest.raises(FileNotFoundError, match="shard 0 of 1"):
    other.restore(str(tmp_path / "nothing"))


@pytest.mark.parametrize("family, attention", [("decllm", "causal"), ("decllm", "prefix"),
                                               ("redllm", "causal")])
def test_batch_shapes_dtypes_and_lengths(make_cfg, redpajama_root, family, attention):
  cfg = _rp(make_cfg, redpajama_root, **{"model.family": family,
                                         "model.decoder_attention": attention})
  batch = next(pipeline.make_iterator(cfg, batch_size=3))
  lengths = pipeline.model_feature_lengths(cfg)
  assert {k: v.shape for k, v in batch.items()} == {k: (3, n) for k, n in lengths.items()}
  assert all(v.dtype == np.int32 for v in batch.values())
  expected_len = 32 if (family, attention) == ("decllm", "causal") else (16 if family == "redllm"
                                                                         else 32)
  assert batch["decoder_target_tokens"].shape[1] == expected_len
  assert ("decoder_causal_attention" in batch) == (attention == "prefix")


@pytest.mark.parametrize("split_mode", ["middle", "random"])
def test_redllm_rows_split_each_chunk_and_continue_positions(make_cfg, redpajama_root, split_mode):
  cfg = _rp(make_cfg, redpajama_root, **{"model.family": "redllm",
                                         "data.prefix_split": split_mode})
  ks = []
  for b in _take(pipeline.make_iterator(cfg, batch_size=8), 6):
    for r in range(8):
      eseg, dseg = b["encoder_segment_ids"][r], b["decoder_segment_ids"][r]
      for s in set(dseg.tolist()) - {0}:
        k, m = int((eseg == s).sum()), int((dseg == s).sum())
        length = k + m
        if split_mode == "middle":
          assert k == max(1, length * 16 // 32), (k, m)
        else:
          assert max(1, length - 16) <= k <= min(length - 1, 16)
        ks.append(k)
        np.testing.assert_array_equal(b["decoder_positions"][r][dseg == s], np.arange(k, k + m))
        np.testing.assert_array_equal(b["encoder_positions"][r][eseg == s], np.arange(k))
  assert 16 in ks  # Full chunks of 32 tokens split 16/16 (or land there at random).
  if split_mode == "random":
    assert len(set(ks)) > 5


def test_validation_reads_each_task_once_and_pads_the_last_batch(make_cfg, redpajama_root):
  cfg = _rp(make_cfg, redpajama_root, **{"data.sequence_length": 256})
  batches = list(pipeline.make_iterator(cfg, split="validation", batch_size=4, repeat=False,
                                        shuffle=False))
  rows = np.concatenate([b["decoder_segment_ids"] for b in batches])
  assert rows.shape[0] % 4 == 0
  # 3 subsets x 5 held-out documents of ~60 tokens: every document once, in rows of 256 tokens.
  n_docs = sum(len(set(r.tolist()) - {0}) for r in rows)
  assert n_docs == 15
  pad_rows = rows[(rows == 0).all(axis=1)]
  assert len(pad_rows) < 4
  last = batches[-1]
  empty = (last["decoder_segment_ids"] == 0).all(axis=1)
  assert all((last[k][empty] == 0).all() for k in last)


def test_held_out_pipeline_is_built_once_and_every_eval_reads_it_from_the_start(
    make_cfg, redpajama_root, monkeypatch):
  from t5like.training.data import PipelineData

  cfg = _rp(make_cfg, redpajama_root, **{"data.sequence_length": 256})
  builds = []
  make = pipeline.make_dataset
  monkeypatch.setattr(pipeline, "make_dataset", lambda *a, **k: builds.append(k) or make(*a, **k))
  data = PipelineData(cfg, check=False)
  first = list(data.eval(1, 0, 1))
  second = data.eval(1, 0, 1)
  next(second)  # A half-read iterator does not move the next eval's start.
  third = list(data.eval(1, 0, 1))
  assert len(builds) == 1 and builds[0]["split"] == "validation"
  assert len(first) > 1 and len(third) == len(first)
  for a, b in zip(first, third):
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
  data.eval(2, 0, 1).close()  # Another batch size is another pipeline.
  assert len(builds) == 2


@pytest.mark.slow
def test_interpreter_exits_with_a_live_iterator(redpajama_root, spm_path):
  from t5like.data import vocab
  code = textwrap.dedent(f"""
      from t5like.config import Config, apply_overrides
      from t5like.data import pipeline
      cfg = Config()
      apply_overrides(cfg, ["data.mixture=redpajama_v1", "data.data_dir={redpajama_root[0]}",
                            "data.vocab_path={spm_path}", "data.sequence_length=32",
                            "model.vocab_size={vocab.vocab_size(spm_path)}",
                            'data.mixture_rates={ONLY_3}'])
      it = pipeline.make_iterator(cfg.validate(), batch_size=2)
      next(it)
      print("ok")
  """)
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]


def _part_rows(data, rows, shard, shards, eval_steps):
  """{part: Counter of non-empty packed rows} this host reads in one eval."""
  out = {}
  for name, rate, open_iterator, n in data.eval_parts(rows, shard, shards, eval_steps):
    it = open_iterator()
    batches = list(it)
    it.close()
    assert n == 0 or len(batches) <= n
    seen = collections.Counter(
        tuple(b["decoder_target_tokens"][r]) for b in batches
        for r in range(b["decoder_target_tokens"].shape[0]) if b["decoder_segment_ids"][r].any())
    out[name] = (rate, seen)
  return out


def test_held_out_sample_covers_every_part_and_is_the_same_on_any_host_count(
    make_cfg, redpajama_root):
  """A 3-part mixture: every part is scored (rows split by rate), every eval reads the same
  rows, and 2 hosts read together exactly the rows 1 host reads."""
  from t5like.data import held_out
  from t5like.training.data import PipelineData

  cfg = _rp(make_cfg, redpajama_root, **{"data.sequence_length": 64})
  parts = held_out.parts(cfg)
  assert [p.name for p in parts] == ["arxiv", "book", "wikipedia"]
  assert sum(p.rate for p in parts) == pytest.approx(1.0)
  one = PipelineData(cfg, check=False)
  # 3 batches of 2 rows: one batch per part, its first 2 rows (of 3 in each part's split).
  first = _part_rows(one, 2, 0, 1, 3)
  assert {n: sum(seen.values()) for n, (_, seen) in first.items()} == {
      "arxiv": 2, "book": 2, "wikipedia": 2}
  assert _part_rows(one, 2, 0, 1, 3) == first  # The same rows at the next eval.
  two = PipelineData(cfg, check=False)
  h0, h1 = _part_rows(two, 1, 0, 2, 3), _part_rows(two, 1, 1, 2, 3)
  for name, (rate, seen) in first.items():
    assert h0[name][1] + h1[name][1] == seen and h0[name][0] == rate
    assert not set(h0[name][1]) & set(h1[name][1])
