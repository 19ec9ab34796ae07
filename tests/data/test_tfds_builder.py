"""TFDS conversion: records round-trip, bad-record counts kept, stale conversions refused."""
import collections
import json
import os
import re
import shutil
import tempfile

import numpy as np
import pytest
import tensorflow_datasets as tfds

from data_helpers import FLAN_SIZES, write_jsonl
from t5like.config import ConfigError
from t5like.data import checks, pipeline, sources, tfds_builder

tfds.disable_progress_bar()


def _jsonl_texts(files, schema, field):
  return sorted(r[field].decode() for f in files for _, r in sources.iter_records(f, schema))


@pytest.fixture(scope="module")
def converted(redpajama_root, flan_root, tmp_path_factory):
  data_dir = str(tmp_path_factory.mktemp("tfds"))
  tfds_builder.prepare_redpajama(redpajama_root[0], data_dir, subsets=["book"],
                                 validation_dir=redpajama_root[1])
  tfds_builder.prepare_flan(flan_root, data_dir)
  return data_dir


def test_conversion_leaves_nothing_in_the_temp_dir(redpajama_root, tmp_path, monkeypatch):
  """TFDS makes a temporary directory for every builder not yet prepared (to fetch precomputed
  info from its bucket) and never removes it: a converted corpus skips that lookup."""
  temp = tmp_path / "tmp"
  temp.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(temp))
  tfds_builder.prepare_redpajama(redpajama_root[0], str(tmp_path / "tfds"), subsets=["book"])
  assert os.listdir(temp) == []


def test_redpajama_conversion_round_trips_the_jsonl_records(converted, redpajama_root):
  for split, root in (("train", redpajama_root[0]), ("validation", redpajama_root[1])):
    ds = tfds.load("t5like_redpajama/book:1.0.0", split=split, data_dir=converted)
    got = sorted(ex["text"].decode() for ex in tfds.as_numpy(ds))
    files = sources.list_shards(f"{root}/book", sources.REDPAJAMA_LAYOUT)
    assert got == _jsonl_texts(files, sources.TEXT_SCHEMA, "text")
    assert len(got) == (40 if split == "train" else 5)


def test_flan_conversion_round_trips_every_task_split(converted, flan_root):
  builder = tfds_builder.prepare_flan("", converted)  # Opens the conversion without the jsonl.
  table = {row["task"]: row for row in tfds_builder.flan_task_table(builder)}
  assert {(row["submixture"], t) for t, row in table.items()} == set(FLAN_SIZES)
  for task_files in sources.flan_tasks(flan_root):
    row = table[task_files.task]
    assert row["sizes"] == {"train": FLAN_SIZES[(task_files.submixture, task_files.task)],
                            "validation": 4}
    for split, path in task_files.splits:
      ds = tfds.load(row["tfds_name"], split=row["splits"][split], data_dir=converted)
      got = sorted(json.dumps({k: v.decode() for k, v in ex.items()}, sort_keys=True)
                   for ex in tfds.as_numpy(ds))
      want = sorted(json.dumps({k: v.decode() for k, v in r.items()}, sort_keys=True)
                    for _, r in sources.iter_records(path, sources.FLAN_SCHEMA))
      assert got == want


def _flan_examples(data_dir, row, split):
  ds = tfds.load(row["tfds_name"], split=row["splits"][split], data_dir=data_dir)
  return sorted(json.dumps({k: v.decode() for k, v in ex.items()}, sort_keys=True)
                for ex in tfds.as_numpy(ds))


@pytest.mark.beam  # make test-beam: apache-beam in .venv-beam.
def test_flan_parts_converted_on_beam_match_one_process(converted, flan_root, tmp_path):
  data_dir = str(tmp_path / "tfds")
  builders = tfds_builder.prepare_flan(flan_root, data_dir, beam_options=[
      "--direct_running_mode=multi_processing", "--direct_num_workers=2"])
  assert list(builders) == list(tfds_builder.FLAN_PART_NAMES)
  one = tfds_builder.flan_task_table(tfds_builder.prepare_flan("", converted))
  two = tfds_builder.flan_task_table(builders)
  assert one == two and [(r["submixture"], r["task"]) for r in two] == sorted(FLAN_SIZES)
  assert len({row["part"] for row in two}) > 1  # The tasks are spread over several parts.
  for row in two:
    assert row["part"] == tfds_builder.flan_part(row["key"])
    assert row["tfds_name"] == f"t5like_flan/{row['part']}:1.0.0"
    assert builders[row["part"]].info.metadata["records"][row["splits"]["train"]]["ok"] == (
        FLAN_SIZES[(row["submixture"], row["task"])])
    for split in row["splits"]:
      got = _flan_examples(data_dir, row, split)
      assert got == _flan_examples(converted, row, split) and len(got) == row["sizes"][split]
  empty = sorted(set(tfds_builder.FLAN_PART_NAMES) - {row["part"] for row in two})[0]
  assert builders[empty].info.metadata["tasks"] == [] and not builders[empty].info.splits


def test_flan_conversion_kept_missing_part_rebuilt_stale_part_refused(flan_root, tmp_path,
                                                                     monkeypatch):
  root, data_dir = str(tmp_path / "flan"), str(tmp_path / "tfds")
  shutil.copytree(flan_root, root)
  with pytest.raises(sources.LayoutError, match=re.escape(os.path.join(data_dir, "t5like_flan"))):
    tfds_builder.prepare_flan("", data_dir)  # Nothing converted yet.
  table = tfds_builder.flan_task_table(tfds_builder.prepare_flan(root, data_dir))
  info = lambda p: os.path.join(data_dir, "t5like_flan", p, "1.0.0", "dataset_info.json")
  mtimes = {p: os.stat(info(p)).st_mtime_ns for p in tfds_builder.FLAN_PART_NAMES}
  built = []
  prepare = tfds_builder.T5likeFlan.download_and_prepare
  monkeypatch.setattr(tfds_builder.T5likeFlan, "download_and_prepare", lambda self, **kw: (
      built.append(self.builder_config.name), prepare(self, **kw))[1])
  assert tfds_builder.flan_task_table(tfds_builder.prepare_flan(root, data_dir)) == table
  assert not built and mtimes == {p: os.stat(info(p)).st_mtime_ns for p in mtimes}
  # An interrupted conversion: reading refuses it, converting builds the missing part only.
  part = table[0]["part"]
  shutil.rmtree(os.path.dirname(info(part)))
  with pytest.raises(sources.LayoutError, match=f"lacks parts {part} "):
    tfds_builder.prepare_flan("", data_dir)
  assert tfds_builder.flan_task_table(tfds_builder.prepare_flan(root, data_dir)) == table
  assert built == [part]
  assert all(os.stat(info(p)).st_mtime_ns == t for p, t in mtimes.items() if p != part)
  # Changed files of one task: its part's fingerprint differs, refused before building anything.
  write_jsonl(tmp_path / "flan" / "sub_b" / "qa" / "train.jsonl",
              [{"inputs": "new", "targets": "data", "task_name": "qa"}])
  with pytest.raises(ValueError, match=r"t5like_flan/part\d\d/1\.0\.0 holds a TFDS conversion"):
    tfds_builder.prepare_flan(root, data_dir)
  assert built == [part]


def test_bad_records_counted_at_conversion_and_stale_conversion_refused(tmp_path):
  root = tmp_path / "rp"
  write_jsonl(root / "arxiv" / "a.jsonl", [{"text": "alpha one"}, {"text": "alpha two"}],
              raw_lines=[b"{oops", b'{"text": ""}', b'{"meta": 1}'])
  data_dir = str(tmp_path / "tfds")
  builders = tfds_builder.prepare_redpajama(str(root), data_dir)
  assert builders["arxiv"].info.splits["train"].num_examples == 2
  assert builders["arxiv"].info.metadata["records"]["train"] == {
      "ok": 2, "invalid_json": 1, "missing_field": 1, "empty_text": 1, "invalid_utf8": 0}
  # Reopening with the same files reuses the conversion; changed files are refused.
  assert tfds_builder.prepare_redpajama(str(root), data_dir)["arxiv"].info.splits[
      "train"].num_examples == 2
  write_jsonl(root / "arxiv" / "a.jsonl", [{"text": "alpha three, different"}])
  with pytest.raises(ValueError, match=r"holds a TFDS conversion of other data"):
    tfds_builder.prepare_redpajama(str(root), data_dir)
  with pytest.raises(sources.BadRecordError, match=r"b\.jsonl:1: bad record"):
    write_jsonl(tmp_path / "rp2" / "book" / "b.jsonl", [], raw_lines=[b"{oops"])
    tfds_builder.prepare_redpajama(str(tmp_path / "rp2"), str(tmp_path / "tfds2"), policy="error")


def _segments(it, tokens: str, segment_ids: str) -> collections.Counter:
  """How often each packed segment's tokens occur over the batches of ``it``."""
  segs = collections.Counter()
  for b in it:
    for row_tokens, row_ids in zip(b[tokens], b[segment_ids]):
      for s in set(row_ids.tolist()) - {0}:
        segs[tuple(row_tokens[row_ids == s])] += 1
  return segs


def test_pipeline_reads_the_conversion_like_the_jsonl(make_cfg, redpajama_root, converted):
  only_book = ('{"arxiv": 0, "c4": 0, "common_crawl": 0, "github": 0, "stackexchange": 0, '
               '"wikipedia": 0}')
  rows = {}
  for source in ("jsonl", "tfds"):
    cfg = make_cfg(**{"data.mixture": "redpajama_v1", "data.data_dir": redpajama_root[0],
                      "data.validation_dir": redpajama_root[1], "data.mixture_rates": only_book,
                      "data.source": source, "data.tfds_data_dir": converted,
                      "data.sequence_length": 256, "model.family": "redllm"})
    it = pipeline.make_iterator(cfg, split="validation", batch_size=2, repeat=False,
                                shuffle=False)
    rows[source] = _segments(it, "encoder_input_tokens", "encoder_segment_ids")
    stats = it.stats()["tasks"]["redpajama_v1.book:prefix_middle"]
    assert stats["where"] == ("tfds_conversion" if source == "tfds" else "read")
  assert rows["jsonl"] == rows["tfds"] and sum(rows["tfds"].values()) == 5
  batch = next(pipeline.make_iterator(cfg, batch_size=2, shard_index=1, num_shards=2))
  assert np.all(batch["decoder_positions"][batch["decoder_segment_ids"] > 0] > 0)


def test_pipeline_reads_the_flan_parts_like_the_jsonl(make_cfg, flan_root, converted):
  rows = {}
  for source in ("jsonl", "tfds"):
    cfg = make_cfg(**{"data.mixture": "flan", "data.data_dir": flan_root, "data.source": source,
                      "data.tfds_data_dir": converted, "data.inputs_length": 64,
                      "model.family": "redllm"})
    it = pipeline.make_iterator(cfg, split="validation", batch_size=4, repeat=False,
                                shuffle=False)
    rows[source] = _segments(it, "decoder_target_tokens", "decoder_segment_ids")
    wheres = {t["where"] for t in it.stats()["tasks"].values()}
    assert wheres == {"tfds_conversion" if source == "tfds" else "read"}
  assert rows["jsonl"] == rows["tfds"] and sum(rows["tfds"].values()) == 4 * len(FLAN_SIZES)
  # Several hosts accept the conversion (all its parts are there) and refuse a missing one.
  checks._check_tfds_shared(cfg, cfg.data.mixture, process_count=4)  # pylint: disable=W0212
  cfg.data.tfds_data_dir = os.path.dirname(converted)
  with pytest.raises(ConfigError, match=r"no TFDS conversion at .*t5like_flan/part00/1\.0\.0"):
    checks._check_tfds_shared(cfg, cfg.data.mixture, process_count=4)  # pylint: disable=W0212
