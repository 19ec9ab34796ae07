"""Tests of the SentencePiece vocabulary helpers and the shipped embedded vocabulary."""
from __future__ import annotations

import json

import pytest
import sentencepiece as spm
import zstandard

from t5like.data import vocab as vocab_lib
from t5like.tools import build_vocab

TEXT = ("Now is the winter of our discontent made glorious summer by this sun of York; "
        "and all the clouds that lour'd upon our house in the deep bosom of the ocean buried.")
NON_ASCII = "Café naïve — 日本語, Ω ≈ 3.14 🙂"


@pytest.fixture(scope="module")
def embedded_sp() -> spm.SentencePieceProcessor:
  return spm.SentencePieceProcessor(model_file=str(vocab_lib.EMBEDDED_VOCAB))


def test_embedded_paths():
  assert vocab_lib.EMBEDDED_DIR.name == "embedded"
  assert vocab_lib.EMBEDDED_VOCAB.parent == vocab_lib.EMBEDDED_DIR
  assert vocab_lib.EMBEDDED_VOCAB.is_file()
  assert vocab_lib.resolve_vocab_path("") == vocab_lib.EMBEDDED_VOCAB


def test_embedded_vocab_ids(embedded_sp):
  sp = embedded_sp
  assert sp.get_piece_size() == vocab_lib.EMBEDDED_VOCAB_SIZE == 8192
  assert (sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id()) == (0, 1, 2, -1)
  assert sp.id_to_piece(0) == "<pad>" and sp.id_to_piece(1) == "</s>"
  assert sp.is_byte(sp.piece_to_id("<0xE6>"))


@pytest.mark.parametrize("text", [TEXT, NON_ASCII])
def test_embedded_vocab_round_trips(embedded_sp, text):
  ids = embedded_sp.encode(text)
  assert vocab_lib.UNK_ID not in ids
  assert embedded_sp.decode(ids) == text


def test_embedded_vocab_is_efficient_on_english(embedded_sp):
  ids = embedded_sp.encode(TEXT)
  assert len(ids) < 1.5 * len(TEXT.split())


def test_get_vocabulary_embedded():
  vocab = vocab_lib.get_vocabulary("")
  assert vocab.vocab_size == 8192
  assert (vocab.pad_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2)
  for text in (TEXT, NON_ASCII):
    assert vocab.decode(vocab.encode(text)) == text
  assert vocab_lib.get_vocabulary("", extra_ids=100).vocab_size == 8292


def test_get_vocabulary_missing_file(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope.model"):
    vocab_lib.get_vocabulary(str(tmp_path / "nope.model"))


def _corpus() -> list[str]:
  path = sorted((vocab_lib.EMBEDDED_DIR / "redpajama" / "book").glob("*.jsonl.zst"))[0]
  raw = zstandard.ZstdDecompressor().decompress(path.read_bytes(), max_output_size=2**28)
  return [json.loads(line)["text"] for line in raw.decode("utf-8").splitlines()[:20]]


def test_train_sentencepiece_ids(tmp_path):
  model = vocab_lib.train_sentencepiece(iter(_corpus()), tmp_path / "spm", 600,
                                        hard_vocab_limit=False)
  assert model == tmp_path / "spm.model" and (tmp_path / "spm.vocab").is_file()
  sp = spm.SentencePieceProcessor(model_file=str(model))
  assert 300 < sp.get_piece_size() <= 600
  assert (sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id()) == (0, 1, 2, -1)
  assert sp.decode(sp.encode(NON_ASCII)) == NON_ASCII  # Byte fallback.


def test_train_sentencepiece_from_files(tmp_path):
  path = tmp_path / "text.txt"
  path.write_text("\n".join(_corpus()[:5]), encoding="utf-8")
  model = vocab_lib.train_sentencepiece(str(path), tmp_path / "m", 400, hard_vocab_limit=False)
  assert spm.SentencePieceProcessor(model_file=str(model)).get_piece_size() <= 400


def test_build_vocab_cli_on_flan_fields(tmp_path):
  pattern = str(vocab_lib.EMBEDDED_DIR / "flan" / "*" / "devils_dictionary_define" / "train.*")
  model = build_vocab.main(["--input", pattern, "--field", "inputs,targets", "--vocab_size", "500",
                            "--no-hard_vocab_limit", "--output_prefix", str(tmp_path / "spm")])
  sp = spm.SentencePieceProcessor(model_file=str(model))
  assert sp.pad_id() == 0 and sp.eos_id() == 1 and sp.unk_id() == 2


def test_build_vocab_missing_glob_names_pattern(tmp_path):
  pattern = str(tmp_path / "missing" / "*.jsonl.zst")
  with pytest.raises(SystemExit, match=r"no file matches --input pattern .*missing/\*\.jsonl\.zst"):
    build_vocab.main(["--input", pattern, "--output_prefix", str(tmp_path / "spm")])


def test_sample_lines_is_deterministic_and_bounded():
  texts = [f"line {i}\nsecond {i}" for i in range(1000)]
  a = build_vocab.sample_lines(iter(texts), 50, 10_000, seed=3)
  b = build_vocab.sample_lines(iter(texts), 50, 10_000, seed=3)
  assert a == b and len(a) == 50
  assert sum(map(len, build_vocab.sample_lines(iter(texts), 500, 300, seed=0))) <= 300


def test_build_vocab_samples_a_corpus_by_subset_rate(tmp_path):
  from t5like.tools import make_paper_corpus
  root = str(tmp_path / "rp")
  make_paper_corpus.write_redpajama(root, scale=0.0004, max_words=5000)
  model = build_vocab.main([
      "--data_dir", root, "--corpus", "redpajama", "--vocab_size", "400", "--no-hard_vocab_limit",
      "--max_characters", "200000", "--rates", '{"github": 0}',
      "--output_prefix", str(tmp_path / "out" / "spm")])
  sp = spm.SentencePieceProcessor(model_file=str(model))
  assert (sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id()) == (0, 1, 2, -1)
  assert sp.piece_to_id("<0x41>") > 2  # Byte fallback pieces.
  record = json.loads((tmp_path / "out" / "spm.json").read_text())
  sample = record["sample"]
  assert sample["github"]["characters"] == 0  # Rate 0: nothing read.
  for subset, s in sample.items():  # Each part stays within its share of the budget.
    assert s["characters"] <= s["budget"]
  cc, c4 = sample["common_crawl"]["budget"], sample["c4"]["budget"]
  assert abs(cc / c4 - 878 / 175) < 0.01  # Shares follow the paper's token counts.
