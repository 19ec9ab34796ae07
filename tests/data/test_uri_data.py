"""Corpus roots may be URIs: the RedPajama reader and the held-out root go only through
``tf.io.gfile``, proven on TensorFlow's in-memory ``ram://`` filesystem (no emulator can serve
TensorFlow's GCS client): the batches equal those read from the local copy."""
from __future__ import annotations

import os

import numpy as np
import pytest

from t5like.config import Config
from t5like.data import pipeline, tasks

SUBSETS = ("book", "c4", "wikipedia")  # What the embedded sample holds.


def _copy_tree(src: str, dst: str) -> None:
  import tensorflow as tf
  for root, _, files in os.walk(src):
    for name in files:
      rel = os.path.relpath(os.path.join(root, name), src)
      tf.io.gfile.makedirs(os.path.dirname(f"{dst}/{rel}"))
      tf.io.gfile.copy(os.path.join(root, name), f"{dst}/{rel}", overwrite=True)


def _first_batches(root: str, validation_root: str) -> list[dict[str, np.ndarray]]:
  cfg = Config()
  cfg.model.vocab_size = 8192
  cfg.data.mixture = "redpajama_v1"
  cfg.data.data_dir, cfg.data.validation_dir = root, validation_root
  cfg.data.vocab_path = os.path.join(tasks.EMBEDDED_DIR, "spm.model")
  cfg.data.mixture_rates = {s: 0 for s in ("arxiv", "common_crawl", "github", "stackexchange")}
  cfg.data.sequence_length = 64
  cfg.validate()
  out = []
  for split in ("train", "validation"):
    it = pipeline.make_iterator(cfg, split=split, batch_size=4, shuffle=False, repeat=False)
    try:
      out.append(next(it))
    finally:
      it.close()
  return out


def test_redpajama_roots_on_a_uri_read_like_local_ones():
  local = (os.path.join(tasks.EMBEDDED_DIR, "redpajama"),
           os.path.join(tasks.EMBEDDED_DIR, "redpajama_validation"))
  uri = ("ram://t5like_test/redpajama", "ram://t5like_test/redpajama_validation")
  for src, dst in zip(local, uri):
    _copy_tree(src, dst)
  from_uri, from_local = _first_batches(*uri), _first_batches(*local)
  for a, b in zip(from_uri, from_local):
    assert sorted(a) == sorted(b)
    for k in a:
      np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert (a["decoder_target_tokens"] > 0).any()


def test_missing_root_on_a_uri_is_a_layout_error_naming_it():
  from t5like.data import sources
  with pytest.raises(sources.LayoutError, match="RedPajama root ram://t5like_empty does not exist"):
    cfg = Config()
    cfg.model.vocab_size = 8192
    cfg.data.mixture, cfg.data.data_dir = "redpajama_v1", "ram://t5like_empty"
    cfg.data.vocab_path = os.path.join(tasks.EMBEDDED_DIR, "spm.model")
    cfg.validate()
    pipeline.make_iterator(cfg, split="train", batch_size=4, shuffle=False, repeat=False)
