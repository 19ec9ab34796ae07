"""Shard readers: record checks, bad-record policy and counts, chunked reading, layout errors."""
import json

import pytest
import tensorflow as tf

from data_helpers import write_jsonl
from t5like.data import pipeline, shard_reader, sources

BAD_LINES = (
    b'{"text": "unterminated',  # invalid_json
    b'["a list", "not an object"]',  # invalid_json
    b'{"txt": "wrong key"}',  # missing_field
    b'{"text": 42}',  # missing_field (not a string)
    b'{"text": ""}',  # empty_text
    b'{"text": "   \\n "}',  # empty_text
    b'{"text": "caf\xe9 latin-1"}',  # invalid_utf8 (raw byte)
    b'{"text": "lone \\ud800 surrogate"}',  # invalid_utf8 (escape that cannot be encoded)
    b'',  # blank line: ignored, not counted
)
EXPECTED_BAD = {"invalid_json": 2, "missing_field": 2, "empty_text": 2, "invalid_utf8": 2}


def _good(n, prefix="good"):
  return [{"text": f"{prefix} record {i}", "meta": {"i": i}} for i in range(n)]


@pytest.mark.parametrize("zst", [False, True])
def test_iter_records_counts_each_bad_kind(tmp_path, zst):
  path = write_jsonl(tmp_path / f"s.jsonl{'.zst' if zst else ''}", _good(3), raw_lines=BAD_LINES,
                     zst=zst)
  stats = sources.RecordStats()
  got = [r["text"].decode() for _, r in sources.iter_records(str(path), sources.TEXT_SCHEMA,
                                                               stats=stats)]
  assert got == [f"good record {i}" for i in range(3)]
  assert stats.as_dict() == {"ok": 3, **EXPECTED_BAD}


def test_error_policy_names_file_line_and_kind(tmp_path):
  path = write_jsonl(tmp_path / "s.jsonl", _good(2), raw_lines=BAD_LINES)
  with pytest.raises(sources.BadRecordError, match=r"s\.jsonl:3: bad record \(invalid json\)"):
    list(sources.iter_records(str(path), sources.TEXT_SCHEMA, policy="error"))


def test_flan_schema_fills_optional_fields(tmp_path):
  rec, bad = sources.parse_record(json.dumps({"inputs": "q", "targets": "a"}).encode(),
                                  sources.FLAN_SCHEMA)
  assert bad is None and rec == {"inputs": b"q", "targets": b"a", "task_name": b"",
                                 "task_source": b"", "template_type": b""}
  assert sources.parse_record(b'{"inputs": "q"}', sources.FLAN_SCHEMA) == (None, "missing_field")
  assert sources.parse_record(b'{"inputs": "q", "targets": " "}', sources.FLAN_SCHEMA) == (
      None, "empty_text")


@pytest.mark.parametrize("zst", [False, True])
def test_chunk_reads_are_pure_and_sequential_reading_matches(tmp_path, zst):
  path = str(write_jsonl(tmp_path / f"c.jsonl{'.zst' if zst else ''}", _good(10), zst=zst))
  kw = dict(policy="skip", label="chunk-test", chunk_size=3)
  seq = [shard_reader.read_chunk(path, i, sources.TEXT_SCHEMA, **kw) for i in range(5)]
  assert [done for done, _ in seq] == [False, False, False, False, True]
  assert [len(cols[0]) for _, cols in seq] == [3, 3, 3, 1, 0]
  # Chunk 2 read cold (no cached stream positioned there) equals the sequential read.
  shard_reader._CACHE = shard_reader._StreamCache()
  assert shard_reader.read_chunk(path, 2, sources.TEXT_SCHEMA, **kw) == seq[2]


def test_jsonl_dataset_reads_all_records_and_resumes_mid_file(tmp_path):
  path = str(write_jsonl(tmp_path / "d.jsonl.zst", _good(11), zst=True, raw_lines=BAD_LINES))
  ds = shard_reader.jsonl_dataset(tf.constant(path), sources.TEXT_SCHEMA, policy="skip",
                             label="ds-test", chunk_size=4)
  opts = tf.data.Options()
  opts.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
  ds = ds.with_options(opts)
  assert [r["text"].numpy().decode() for r in ds] == [f"good record {i}" for i in range(11)]
  it = iter(ds)
  for _ in range(6):
    next(it)
  ckpt = tf.train.Checkpoint(it=it)
  prefix = ckpt.write(str(tmp_path / "ck"))
  rest = [r["text"].numpy() for r in it]
  shard_reader._CACHE = shard_reader._StreamCache()  # Force the restored reader to reopen and skip.
  it2 = iter(ds)
  tf.train.Checkpoint(it=it2).read(prefix).assert_consumed()
  assert [r["text"].numpy() for r in it2] == rest and len(rest) == 5


def test_missing_paths_fail_at_once_naming_path_and_layout(tmp_path):
  with pytest.raises(sources.LayoutError, match=r"RedPajama root .*nope does not exist; expected "
                     r"RedPajama-V1 layout <root>/<subset>/\*\.jsonl"):
    sources.redpajama_subsets(str(tmp_path / "nope"))
  (tmp_path / "rp" / "book").mkdir(parents=True)
  with pytest.raises(sources.LayoutError, match=r"no \*\.jsonl or \*\.jsonl\.zst shards in "
                     r".*rp/book.*expected RedPajama"):
    sources.redpajama_subsets(str(tmp_path / "rp"))
  (tmp_path / "empty").mkdir()
  with pytest.raises(sources.LayoutError, match=r"no subset directory .* in .*empty"):
    sources.redpajama_subsets(str(tmp_path / "empty"))
  with pytest.raises(sources.LayoutError, match=r"FLAN root .*nofl does not exist; expected FLAN "
                     r"layout <root>/<submixture>/<task_name>/<split>\.jsonl"):
    sources.flan_tasks(str(tmp_path / "nofl"))
  with pytest.raises(sources.LayoutError, match=r"no task with train/validation shards under"):
    sources.flan_tasks(str(tmp_path / "empty"))


def test_pipeline_missing_subset_and_data_dir(make_cfg, tmp_path, redpajama_root):
  cfg = make_cfg(**{"data.mixture": "redpajama_v1", "data.data_dir": str(tmp_path / "absent")})
  with pytest.raises(sources.LayoutError, match=r"RedPajama root .*absent does not exist"):
    pipeline.make_iterator(cfg, batch_size=2)
  # Present corpus, but c4 has a positive (default) rate and no directory.
  cfg = make_cfg(**{"data.mixture": "redpajama_v1", "data.data_dir": redpajama_root[0],
                    "data.mixture_rates": '{"common_crawl": 0}'})
  with pytest.raises(sources.LayoutError, match=r"subset directory .*c4 does not exist .*"
                     r"mixture_rates=\{\"c4\": 0\}"):
    pipeline.make_iterator(cfg, batch_size=2)


def _bad_corpus(tmp_path):
  root = tmp_path / "bad"
  write_jsonl(root / "book" / "b-0.jsonl", _good(4, "bravo"), raw_lines=BAD_LINES)
  write_jsonl(root / "book" / "b-1.jsonl.zst", _good(3, "bravo"), zst=True,
              raw_lines=BAD_LINES[:3])
  return str(root)


ONLY_BOOK = ('{"arxiv": 0, "c4": 0, "common_crawl": 0, "github": 0, "stackexchange": 0, '
             '"wikipedia": 0}')


def test_pipeline_skip_policy_reports_counts(make_cfg, tmp_path):
  cfg = make_cfg(**{"data.mixture": "redpajama_v1", "data.data_dir": _bad_corpus(tmp_path),
                    "data.mixture_rates": ONLY_BOOK})
  it = pipeline.make_iterator(cfg, batch_size=2, repeat=False, shuffle=False)
  rows = sum(int((b["decoder_segment_ids"].max(axis=1) > 0).sum()) for b in it)
  assert rows >= 1
  stats = it.stats()
  assert stats["totals"] == {"ok": 7, "invalid_json": 4, "missing_field": 3, "empty_text": 2,
                             "invalid_utf8": 2}
  assert stats["bad_records"] == 11
  assert stats["tasks"]["redpajama_v1.book:lm"]["ok"] == 7


def test_pipeline_error_policy_fails_naming_the_record(make_cfg, tmp_path):
  root = tmp_path / "bad1"
  write_jsonl(root / "book" / "b-0.jsonl", _good(4, "bravo"), raw_lines=BAD_LINES)
  cfg = make_cfg(**{"data.mixture": "redpajama_v1", "data.data_dir": str(root),
                    "data.mixture_rates": ONLY_BOOK, "data.bad_records": "error"})
  it = pipeline.make_iterator(cfg, batch_size=2, repeat=False, shuffle=False)
  with pytest.raises(Exception, match=r"b-0\.jsonl:5: bad record \(invalid json\)"):
    for _ in it:
      pass


def test_reading_never_changes_the_open_file_limit_and_a_run_raises_it_explicitly(tmp_path,
                                                                                  monkeypatch):
  """The reader keeps its open streams within the current limit; only
  ``raise_open_file_limit`` (called and logged at a run's start) changes the limit."""
  import resource
  soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
  low = 512 if hard == resource.RLIM_INFINITY or hard >= 1024 else hard // 2
  resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
  try:
    cache = shard_reader._StreamCache(capacity=4096)  # pylint: disable=protected-access
    monkeypatch.setattr(shard_reader, "_CACHE", cache)
    paths = [str(write_jsonl(tmp_path / f"f{i}.jsonl", _good(4))) for i in range(3)]
    for p in paths:
      shard_reader.read_chunk(p, 0, sources.TEXT_SCHEMA, policy="skip", label="lim", chunk_size=2)
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (low, hard)  # Reading: no change.
    assert cache.capacity() == max(8, low - 256)  # Fewer streams under a low limit.
    changed = shard_reader.raise_open_file_limit(low + 300)
    assert changed == (low, low + 300) or hard != resource.RLIM_INFINITY and hard < low + 300
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == min(low + 300, hard)
    assert cache.capacity() == min(4096, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 256)
    assert shard_reader.raise_open_file_limit(low) is None  # Never lowered.
  finally:
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
