"""TFDS conversion: records round-trip, bad-record counts kept, stale conversions refused."""
import collections
import json

import numpy as np
import pytest
import tensorflow_datasets as tfds

from data_helpers import FLAN_SIZES, write_jsonl
from t5like.data import pipeline, sources, tfds_builder

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
      ds = tfds.load(f"t5like_flan:1.0.0", split=row["splits"][split], data_dir=converted)
      got = sorted(json.dumps({k: v.decode() for k, v in ex.items()}, sort_keys=True)
                   for ex in tfds.as_numpy(ds))
      want = sorted(json.dumps({k: v.decode() for k, v in r.items()}, sort_keys=True)
                    for _, r in sources.iter_records(path, sources.FLAN_SCHEMA))
      assert got == want


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
    segs = collections.Counter()
    for b in it:
      for r in range(2):
        for s in set(b["encoder_segment_ids"][r].tolist()) - {0}:
          segs[tuple(b["encoder_input_tokens"][r][b["encoder_segment_ids"][r] == s])] += 1
    rows[source] = segs
    stats = it.stats()["tasks"]["redpajama_v1.book:prefix_middle"]
    assert stats["where"] == ("tfds_conversion" if source == "tfds" else "read")
  assert rows["jsonl"] == rows["tfds"] and sum(rows["tfds"].values()) == 5
  batch = next(pipeline.make_iterator(cfg, batch_size=2, shard_index=1, num_shards=2))
  assert np.all(batch["decoder_positions"][batch["decoder_segment_ids"] > 0] > 0)
