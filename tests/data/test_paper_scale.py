"""Data at paper scale: stream chunking, validation hold-out, start-up checks, linear reading,
cached mixing counts, extra eval sets."""
from __future__ import annotations

import collections
import json
import os
import shutil

import numpy as np
import pytest
import seqio

from data_helpers import write_jsonl
from t5like.config import ConfigError
from t5like.data import checks, counts, pipeline, shard_reader, sources, validation
from t5like.training.data import PipelineData

# The fixture corpus has arxiv, book and wikipedia only.
ONLY_3 = json.dumps({"c4": 0, "common_crawl": 0, "github": 0, "stackexchange": 0})


@pytest.fixture
def rp_cfg(make_cfg):
  """make_cfg for the RedPajama fixture (its three subsets only)."""
  return lambda **kw: make_cfg(**{"data.mixture": "redpajama_v1", "data.mixture_rates": ONLY_3,
                                  **kw})


def _rows(cfg, n=None, **kw):
  it = pipeline.make_iterator(cfg, batch_size=4, shuffle=False, repeat=False, **kw)
  out = [b for _, b in zip(range(n or 10**6), it)]
  it.close()
  return out


def _doc_tokens(cfg, task):
  """Token ids of every document of ``task`` + EOS, in the unshuffled reading order."""
  vocab = seqio.SentencePieceVocabulary(cfg.data.vocab_path)
  return [t for text in _raw(task, "validation" if "extra" in task else "train")
          for t in vocab.encode(text.decode()) + [1]]


def _raw(task: str, split: str) -> list[bytes]:
  ds = seqio.get_mixture_or_task(task).source.get_dataset(split=split, shuffle=False)
  return [ex["text"] for ex in ds.as_numpy_iterator()]


def test_stream_rows_are_exactly_inputs_plus_targets_and_follow_the_stream(
    rp_cfg, redpajama_root):
  root, _ = redpajama_root
  cfg = rp_cfg(**{"model.family": "redllm", "data.mixture": "redpajama_v1.arxiv",
                    "data.data_dir": root, "data.pretrain_chunking": "stream"})
  stream = _doc_tokens(cfg, pipeline.resolve_mixture(cfg))
  got = []
  it = pipeline.make_iterator(cfg, split="train", batch_size=4, shuffle=False, repeat=True)
  for _ in range(len(stream) // 32 // 4):
    b = next(it)
    # One segment per row, every position used: 16 input + 16 target tokens, all with loss.
    assert (b["encoder_segment_ids"] == 1).all() and (b["decoder_segment_ids"] == 1).all()
    assert (b["decoder_loss_weights"] == 1).all()
    assert (b["decoder_positions"][:, 0] == 16).all()  # Continuous RedLLM positions.
    got += [t for row in range(4) for t in list(b["encoder_input_tokens"][row])
            + list(b["decoder_target_tokens"][row])]
  it.close()
  assert got == stream[:len(got)]  # Documents + EOS concatenated, crossing boundaries.
  doc_cfg = rp_cfg(**{"model.family": "redllm", "data.mixture": "redpajama_v1.arxiv",
                        "data.data_dir": root, "data.pretrain_chunking": "document"})
  seg = np.concatenate([b["encoder_segment_ids"] for b in _rows(doc_cfg)])
  assert seg.max() > 1  # Document mode packs several shorter chunks per row instead.


def test_stream_causal_rows_are_full(rp_cfg, redpajama_root):
  root, _ = redpajama_root
  cfg = rp_cfg(**{"data.mixture": "redpajama_v1.book", "data.data_dir": root,
                    "data.pretrain_chunking": "stream"})
  tokens = np.concatenate([b["decoder_target_tokens"] for b in _rows(cfg)])
  tokens = tokens[tokens.any(axis=1)]  # The last batch is padded with all-zero rows.
  assert len(tokens) > 10 and (tokens > 0).all() and tokens.shape[1] == 32
  stream = _doc_tokens(cfg, pipeline.resolve_mixture(cfg))
  assert tokens.ravel().tolist() == stream[:tokens.size]
  assert len(stream) - tokens.size < 32  # Only the last partial sequence is left out.


def test_validation_holdout_is_disjoint_deterministic_and_complete(rp_cfg, redpajama_root):
  root, _ = redpajama_root
  cfg = rp_cfg(**{"data.data_dir": root, "data.validation_holdout": 0.3})
  task = seqio.get_mixture_or_task(pipeline.resolve_mixture(cfg)).tasks[0].name
  train, held = _raw(task, "train"), _raw(task, "validation")
  everything = []
  for path in sources.list_shards(os.path.join(root, task.split(".")[1].split(":")[0]), ""):
    everything += [r["text"] for _, r in sources.iter_records(path, sources.TEXT_SCHEMA)]
  assert not set(train) & set(held)  # Training never sees a held-out document.
  assert sorted(train + held) == sorted(everything)  # Nothing lost.
  assert 0.1 < len(held) / len(everything) < 0.5
  assert _raw(task, "validation") == held  # Same documents every time...
  cfg2 = rp_cfg(**{"data.data_dir": root, "data.validation_holdout": 0.3, "data.seed": 5})
  task2 = seqio.get_mixture_or_task(pipeline.resolve_mixture(cfg2)).tasks[0].name
  assert sorted(_raw(task2, "validation")) == sorted(held)  # ...whatever the seed.
  # The held-out batches hold exactly the held-out documents' tokens.
  batches = _rows(cfg, split="validation", mixture=task.split(":")[0])
  assert batches and sum(int((b["decoder_loss_weights"] > 0).sum()) for b in batches) > 0


def test_flan_tasks_without_validation_files_get_a_holdout(make_cfg, flan_root, tmp_path):
  root = str(tmp_path / "flan")
  shutil.copytree(flan_root, root)
  for dirpath, _, files in os.walk(root):
    for f in files:
      if f.startswith("validation"):
        os.remove(os.path.join(dirpath, f))
  cfg = make_cfg(**{"data.mixture": "flan", "data.data_dir": root})
  with pytest.raises(ConfigError, match="no validation data.*validation_holdout=0.001"):
    checks.check_data(cfg, evaluate=True)
  cfg = make_cfg(**{"data.mixture": "flan", "data.data_dir": root,
                    "data.validation_holdout": 0.3})
  checks.check_data(cfg, evaluate=True)
  name = "flan.sub_a.define"
  ds = seqio.get_mixture_or_task(name).source
  train = [e["inputs"] for e in ds.get_dataset("train", shuffle=False).as_numpy_iterator()]
  held = [e["inputs"] for e in ds.get_dataset("validation", shuffle=False).as_numpy_iterator()]
  assert held and train and not set(train) & set(held) and len(train) + len(held) == 60


def test_start_up_checks_name_path_expectation_and_flag(rp_cfg, redpajama_root, tmp_path):
  root, val = redpajama_root
  cfg = rp_cfg(**{"data.data_dir": root})
  with pytest.raises(ConfigError, match="validation_dir is empty.*validation_holdout=0.001"):
    checks.check_data(cfg, evaluate=True)
  checks.check_data(rp_cfg(**{"data.data_dir": root, "data.validation_dir": val}),
                    evaluate=True)
  size = cfg.model.vocab_size
  for wrong in (size - 1, size + 1):  # Smaller and larger are both refused.
    bad = rp_cfg(**{"data.data_dir": root, "model.vocab_size": wrong})
    with pytest.raises(ConfigError, match=f"has {size} pieces but model.vocab_size={wrong}.*"
                       "must be equal.*build_vocab"):
      checks.check_data(bad, evaluate=False)
  with pytest.raises(ConfigError, match="data.vocab_path is empty.*build_vocab.*--corpus "
                     "redpajama"):
    checks.check_data(rp_cfg(**{"data.data_dir": root, "data.vocab_path": ""}),
                      evaluate=False)
  empty = tmp_path / "rp"
  shutil.copytree(root, empty)
  for f in os.listdir(empty / "book"):
    (empty / "book" / f).write_bytes(b"")
  with pytest.raises(ConfigError, match=r"rp/book holds only empty shards.*mixture_rates"):
    checks.check_data(rp_cfg(**{"data.data_dir": str(empty)}), evaluate=False)
  with pytest.raises(ConfigError, match="no_corpus.*does not exist.*RedPajama-V1 layout"):
    checks.check_data(rp_cfg(**{"data.data_dir": str(tmp_path / "no_corpus")}))
  with pytest.raises(ConfigError, match=r"extra_eval\['paloma'\].*nowhere.*does not exist"):
    checks.check_data(rp_cfg(**{"data.data_dir": root, "data.validation_dir": val,
                                  "data.extra_eval": json.dumps({"paloma": "/nowhere"})}),
                      evaluate=True)


def test_extra_eval_directory_is_scored_as_its_own_set(rp_cfg, redpajama_root):
  root, val = redpajama_root
  cfg = rp_cfg(**{"data.data_dir": root, "data.validation_dir": val,
                    "data.extra_eval": json.dumps({"wiki": os.path.join(val, "wikipedia")})})
  evals = PipelineData(cfg).extra_evals(4, 0, 1)
  batches = list(evals["wiki"])
  evals["wiki"].close()
  stream = _doc_tokens(cfg, pipeline.extra_eval_mixtures(cfg)["wiki"])
  tokens = np.concatenate([b["decoder_target_tokens"] for b in batches]).ravel()
  assert tokens[tokens > 0].tolist() == stream[:int((tokens > 0).sum())]


def _write_files(d, n_files, n_lines, zst):
  paths = []
  for i in range(n_files):
    recs = [{"text": f"file {i} line {j}"} for j in range(n_lines)]
    paths.append(str(write_jsonl(d / f"f{i:04d}.jsonl{'.zst' if zst else ''}", recs, zst=zst)))
  return paths


@pytest.mark.parametrize("zst,capacity", [(True, None), (False, 8)])
def test_reader_never_rereads_a_prefix_when_interleaving_many_files(tmp_path, monkeypatch, zst,
                                                                    capacity):
  paths = _write_files(tmp_path, 300, 12, zst)
  cache = shard_reader._StreamCache(capacity=capacity)  # pylint: disable=protected-access
  monkeypatch.setattr(shard_reader, "_CACHE", cache)
  got = collections.defaultdict(list)
  for index in range(4):  # Round-robin over 300 files, one 4-line chunk each: FLAN-like mixing.
    for path in paths:
      done, cols = shard_reader.read_chunk(path, index, sources.TEXT_SCHEMA, policy="error",
                                      label="t", chunk_size=4)
      assert done == (index == 3)
      got[path] += cols[0]
  assert all(got[p] == [f"file {i} line {j}".encode() for j in range(12)]
             for i, p in enumerate(paths))
  assert cache.rescanned_lines == 0  # No prefix read twice...
  if capacity:  # ...and with fewer open streams than files, plain files reopen with a seek.
    assert cache.reopened > 0


def _tree(root):
  return sorted((str(p.relative_to(root)), p.stat().st_mtime_ns) for p in root.rglob("*"))


def test_mixing_counts_are_cached_under_the_cache_dir_and_invalidated(flan_root, tmp_path,
                                                                     monkeypatch):
  """The counts go to $T5LIKE_CACHE keyed by the corpus; a read-only corpus is left untouched."""
  monkeypatch.setenv("T5LIKE_CACHE", str(tmp_path / "cache"))
  root = tmp_path / "flan"
  shutil.copytree(flan_root, root)
  (root / counts.CACHE_NAME).unlink(missing_ok=True)  # An older version's cache: none here.
  before = _tree(root)
  dirs = [root] + [p for p in root.rglob("*") if p.is_dir()]
  for d in dirs:
    d.chmod(0o555)  # A read-only (e.g. shared) corpus.
  try:
    first = counts.CorpusCounts(str(root), sources.FLAN_SCHEMA)
    define = [p for t in sources.flan_tasks(str(root)) for s, p in t.splits
              if s == "train" and t.task == "define"]
    assert first.count(define)[0] == 60 and first.counted == 3
    assert first.cache_path == counts.cache_path(str(root)) and os.path.exists(first.cache_path)
    assert first.cache_path.startswith(str(tmp_path / "cache" / "counts" / "flan-"))
    assert _tree(root) == before  # Nothing written into the corpus.
    second = counts.CorpusCounts(str(root), sources.FLAN_SCHEMA)  # Another host / a restart.
    assert second.count(define)[0] == 60 and second.counted == 0
  finally:
    for d in dirs:
      d.chmod(0o755)
  other = tmp_path / "other" / "flan"  # Another corpus of the same name: its own cache.
  assert counts.cache_path(str(other)) != counts.cache_path(str(root))
  qa = root / "sub_b" / "qa" / "train.jsonl"
  with open(qa, "a") as f:
    f.write(json.dumps({"inputs": "new", "targets": "record"}) + "\n")
  counts._COUNT_CACHE.clear()  # pylint: disable=protected-access
  third = counts.CorpusCounts(str(root), sources.FLAN_SCHEMA)
  assert third.count([str(qa)])[0] == 11 and third.counted == 1  # Only the changed file.
  assert not (root / counts.CACHE_NAME).exists()


def test_holdout_hash_is_a_pure_function_of_the_text():
  import tensorflow as tf
  texts = tf.constant([f"document {i}" for i in range(2000)])
  a = validation.is_held_out(texts, 0.1).numpy()
  assert (a == validation.is_held_out(texts, 0.1).numpy()).all()
  assert 0.07 < a.mean() < 0.13
  assert (validation.is_held_out(texts, 0.2).numpy() >= a).all()  # Nested slices.


def test_multi_host_tfds_needs_one_shared_conversion(rp_cfg, redpajama_root, tmp_path):
  root, _ = redpajama_root
  cfg = rp_cfg(**{"data.data_dir": root, "data.source": "tfds"})
  with pytest.raises(ConfigError, match="shared data.tfds_data_dir.*prepare_data"):
    checks._check_tfds_shared(cfg, cfg.data.mixture, process_count=4)  # pylint: disable=W0212
  shared = str(tmp_path / "tfds")
  cfg = rp_cfg(**{"data.data_dir": root, "data.source": "tfds", "data.tfds_data_dir": shared})
  with pytest.raises(ConfigError, match="no TFDS conversion at .*tfds/t5like_redpajama/arxiv"):
    checks._check_tfds_shared(cfg, cfg.data.mixture, process_count=4)  # pylint: disable=W0212


@pytest.mark.beam  # make test-beam: apache-beam in .venv-beam.
def test_prepare_data_converts_subsets_on_beam_once_for_all_hosts(rp_cfg, redpajama_root,
                                                                 tmp_path, capsys):
  from t5like.tools import prepare_data
  root, _ = redpajama_root
  shared = str(tmp_path / "tfds")
  cfg = rp_cfg(**{"data.data_dir": root, "data.source": "tfds", "data.tfds_data_dir": shared})
  report = prepare_data.main(["--corpus", "redpajama", "--data_dir", root, "--tfds_data_dir",
                              shared, "--direct_running_mode=multi_processing",
                              "--direct_num_workers=2"])["tfds"]
  capsys.readouterr()
  assert sorted(report) == ["arxiv", "book", "wikipedia"]
  assert report["arxiv"]["examples"]["train"] == 40
  from t5like.data import tfds_builder
  builder = tfds_builder.prepare_redpajama("", shared, subsets=["arxiv"])["arxiv"]
  assert builder.info.metadata["records"]["train"]["ok"] == 40  # Counted by the workers.
  checks._check_tfds_shared(cfg, cfg.data.mixture, process_count=4)  # pylint: disable=W0212


def test_flan_grouped_by_submixture_keeps_capped_examples_proportional_mixing(make_cfg,
                                                                             flan_root):
  cfg = make_cfg(**{"data.mixture": "flan", "data.data_dir": flan_root,
                    "data.flan_grouping": "submixture", "data.flan_example_cap": 20})
  mixture = seqio.get_mixture_or_task(pipeline.resolve_mixture(cfg))
  assert sorted(t.name for t in mixture.tasks) == ["flan.sub_a", "flan.sub_b"]  # 2 pipelines.
  assert {t.name: mixture.get_rate(t) for t in mixture.tasks} == {
      "flan.sub_a": 40.0, "flan.sub_b": 10.0}  # min(60, 20) + min(30, 20); min(10, 20).
  ds = seqio.get_mixture_or_task("flan.sub_a").source.get_dataset("train", shuffle=False)
  per_task = collections.Counter(ex["task_name"] for ex in ds.as_numpy_iterator())
  assert per_task == {b"define": 20, b"continue": 20}  # Each file capped per epoch.
  assert _rows(cfg, n=2)  # And it batches.
  bad = make_cfg(**{"data.mixture": "flan", "data.data_dir": flan_root,
                    "data.flan_grouping": "submixture",
                    "data.mixture_rates": json.dumps({"define": 3})})
  with pytest.raises(ValueError, match="flan_grouping='task' for per-task rates"):
    pipeline.resolve_mixture(bad)


def test_flan_tfds_grouped_by_submixture_caps_each_task(make_cfg, flan_root, tmp_path):
  """data.source=tfds with submixture grouping: one pipeline per sub-mixture over the conversion
  parts holding its tasks (not one per task), each task's train split sliced to the cap, rates =
  capped sizes."""
  from t5like.data import tasks, tfds_builder
  common = {"data.mixture": "flan", "data.data_dir": flan_root, "data.source": "tfds",
            "data.tfds_data_dir": str(tmp_path / "tfds"), "data.flan_grouping": "submixture",
            "data.flan_example_cap": 20}
  parts = {t: tfds_builder.flan_part(tfds_builder.task_key(t)) for t in ("define", "continue")}
  assert parts["define"] != parts["continue"]  # sub_a spans two parts: they are sampled.
  cfg = make_cfg(**common)
  mixture = seqio.get_mixture_or_task(pipeline.resolve_mixture(cfg))
  assert {t.name: mixture.get_rate(t) for t in mixture.tasks} == {
      "flan.sub_a": 40.0, "flan.sub_b": 10.0}  # min(60, 20) + min(30, 20); min(10, 20).
  sub_a = seqio.get_mixture_or_task("flan.sub_a")
  ds = sub_a.source.get_dataset("train", shuffle=False)
  order = [ex["task_name"] for ex in ds.as_numpy_iterator()]
  assert collections.Counter(order) == {b"define": 20, b"continue": 20}  # Capped per epoch,
  assert len(set(order[:10])) == 2  # and the parts interleave rather than follow each other.
  valid = list(sub_a.source.get_dataset("validation", shuffle=False).as_numpy_iterator())
  assert len(valid) == 8  # Validation is read whole: 4 + 4.
  assert tasks.task_stats("flan.sub_a")["ok"] == 90  # Converted records, summed over tasks.
  assert _rows(cfg, n=2)  # And it batches,
  assert _rows(cfg, n=1, shard_index=1, num_shards=2)  # also as one of two hosts.
  drop = make_cfg(**common, **{"data.mixture_rates": json.dumps({"continue": 0})})
  mixture = seqio.get_mixture_or_task(pipeline.resolve_mixture(drop))
  assert {t.name: mixture.get_rate(t) for t in mixture.tasks} == {
      "flan.sub_a": 20.0, "flan.sub_b": 10.0}
  bad = make_cfg(**common, **{"data.mixture_rates": json.dumps({"define": 3})})
  with pytest.raises(ValueError, match="flan_grouping='task' for per-task rates"):
    pipeline.resolve_mixture(bad)
