"""Fixtures for the data tests: a tiny SentencePiece model and tiny corpora in both layouts.

Every corpus is written under pytest's tmp directories; nothing depends on the embedded data.
RedPajama fixture documents use one marker word per subset (``alpha`` for arxiv, ``bravo`` for
book, ``charlie`` for wikipedia) so a token tells which subset an example came from.
"""
from __future__ import annotations

import io
import os
import random

import pytest

from data_helpers import FLAN_SIZES, MARKERS, WORDS, make_doc, write_jsonl

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # Keep TensorFlow's C++ logging quiet.


@pytest.fixture(scope="session")
def spm_path(tmp_path_factory) -> str:
  """A ~300-piece unigram SentencePiece model with T5 ids (pad 0, eos 1, unk 2, no BOS)."""
  import sentencepiece as spm

  d = tmp_path_factory.mktemp("spm")
  rng = random.Random(0)
  extra = "define continue qa answer 0 1 2 3 4 5 6 7 8 9".split()
  lines = [" ".join(rng.choice(WORDS + extra) for _ in range(12)) for _ in range(3000)]
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(lines), model_writer=model, vocab_size=300, model_type="unigram",
      pad_id=0, eos_id=1, unk_id=2, bos_id=-1, hard_vocab_limit=False, minloglevel=2,
      num_threads=1)
  path = d / "tiny.model"
  path.write_bytes(model.getvalue())
  return str(path)


@pytest.fixture(scope="session")
def redpajama_root(tmp_path_factory) -> tuple[str, str]:
  """(train root, validation root) in RedPajama-V1 layout: arxiv, book, wikipedia subsets."""
  d = tmp_path_factory.mktemp("redpajama")
  rng = random.Random(1)
  sizes = {"arxiv": 40, "book": 40, "wikipedia": 40}
  for subset, n_docs in sizes.items():
    marker = MARKERS[subset]
    for shard in range(2):
      docs = [{"text": make_doc(rng, marker, rng.randint(5, 60)),
               "meta": {"id": f"{subset}-{shard}-{i}"}} for i in range(n_docs // 2)]
      write_jsonl(d / "train" / subset / f"{subset}-{shard:05d}-of-00002.jsonl"
                  f"{'.zst' if shard else ''}", docs, zst=bool(shard))
    val = [{"text": make_doc(rng, marker, 30)} for _ in range(5)]
    write_jsonl(d / "validation" / subset / f"{subset}-00000-of-00001.jsonl.zst", val, zst=True)
  return str(d / "train"), str(d / "validation")


@pytest.fixture(scope="session")
def flan_root(tmp_path_factory) -> str:
  """FLAN layout: sub_a/{define (60), continue (30)}, sub_b/qa (10); 4 validation each."""
  d = tmp_path_factory.mktemp("flan")
  rng = random.Random(2)
  for (sub, task), n in FLAN_SIZES.items():
    for split, count in (("train", n), ("validation", 4)):
      records = [{"inputs": f"{task} {i} " + make_doc(rng, 'delta', rng.randint(3, 20)),
                  "targets": f"{task} answer {i} " + make_doc(rng, 'echo', rng.randint(1, 8)),
                  "task_name": task, "task_source": sub, "template_type": "zs_opt"}
                 for i in range(count)]
      write_jsonl(d / sub / task / f"{split}.jsonl{'.zst' if task == 'define' else ''}",
                  records, zst=task == "define")
  return str(d)


@pytest.fixture
def make_cfg(spm_path):
  """Builds a validated Config with small lengths; keyword args are dotted overrides."""
  from t5like.config import Config, apply_overrides

  from t5like.data import vocab

  size = vocab.vocab_size(spm_path)  # The model's vocabulary must match it exactly.

  def build(**overrides):
    cfg = Config()
    base = {"data.vocab_path": spm_path, "data.sequence_length": "32", "data.inputs_length": "16",
            "data.targets_length": "16", "data.shuffle_buffer_size": "64",
            "model.vocab_size": str(size),
            "data.pretrain_chunking": "document"}  # Stream mode: test_chunking.py.
    base.update({k.replace("__", "."): str(v) if not isinstance(v, str) else v
                 for k, v in overrides.items()})
    apply_overrides(cfg, [f"{k}={v}" for k, v in base.items()])
    return cfg.validate()
  return build


@pytest.fixture(autouse=True, scope="session")
def _tmp_cache(tmp_path_factory):
  """Keeps TFDS conversions made with default directories inside pytest's tmp tree."""
  old = os.environ.get("T5LIKE_CACHE")
  os.environ["T5LIKE_CACHE"] = str(tmp_path_factory.mktemp("t5like_cache"))
  yield
  if old is None:
    os.environ.pop("T5LIKE_CACHE", None)
  else:
    os.environ["T5LIKE_CACHE"] = old
