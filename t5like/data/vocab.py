"""SentencePiece vocabularies with the T5 id convention.

Ids: ``pad=0``, ``eos=1``, ``unk=2`` and no BOS, as in T5; unigram model with byte fallback so any
UTF-8 text round-trips up to normalisation (characters outside the pieces become ``<0x..>`` bytes).
Normalisation is T5's ``nmt_nfkc`` (NFKC, and newlines/tabs become spaces).

``get_vocabulary("")`` returns the vocabulary shipped with the embedded corpus
(``t5like/data/embedded/spm.model``, 8192 pieces, built by ``t5like.tools.build_vocab``; see
``t5like/data/embedded/PROVENANCE.md``). ``seqio`` is imported lazily: it costs seconds and ~1 GB.
"""
from __future__ import annotations

import io
import os
import pathlib
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence, Union

from t5like.errors import UserError

if TYPE_CHECKING:  # pragma: no cover
  import seqio

EMBEDDED_DIR = pathlib.Path(__file__).resolve().parent / "embedded"
EMBEDDED_VOCAB = EMBEDDED_DIR / "spm.model"
EMBEDDED_VOCAB_SIZE = 8192
T5_EXTRA_IDS = 100  # T5's sentinel count: with the embedded vocabulary, model.vocab_size = 8292.

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2

# SentencePiece's trainer rejects longer "sentences" unless told otherwise; we cut instead.
MAX_SENTENCE_CHARS = 4096

# A file path, a list/tuple of file paths, or an iterator of texts (e.g. ``iter(strings)``).
TextSource = Union[str, os.PathLike, Sequence[Union[str, os.PathLike]], Iterable[str]]


def _is_paths(source: object) -> bool:
  """A path, or a list/tuple of paths, means files; any other iterable yields texts."""
  return isinstance(source, (str, os.PathLike, list, tuple))


def _clean_lines(text: str) -> Iterator[str]:
  for line in text.splitlines():
    line = line.strip()
    if line:
      yield line[:MAX_SENTENCE_CHARS]


def _iter_sentences(source: TextSource) -> Iterator[str]:
  """Yields non-empty lines from text files (a path or list of paths) or from strings."""
  if _is_paths(source):
    paths = [source] if isinstance(source, (str, os.PathLike)) else source
    for path in paths:
      with open(path, encoding="utf-8") as f:
        for line in f:
          yield from _clean_lines(line)
    return
  for text in source:
    yield from _clean_lines(str(text))


def train_sentencepiece(
    text_files_or_iterator: TextSource,
    model_prefix: str | os.PathLike,
    vocab_size: int,
    *,
    model_type: str = "unigram",
    character_coverage: float = 0.9995,
    byte_fallback: bool = True,
    hard_vocab_limit: bool = True,
    normalization_rule_name: str = "nmt_nfkc",
    input_sentence_size: int = 0,
    split_digits: bool = False,
    num_threads: int = 2,
    seed_sentencepiece_size: int = 1_000_000,
    user_defined_symbols: Sequence[str] = (),
    verbose: bool = False,
) -> pathlib.Path:
  """Trains a SentencePiece model with T5 ids; writes ``<prefix>.model`` and ``<prefix>.vocab``.

  Args:
    text_files_or_iterator: a text file path or a list/tuple of paths (one sentence per line),
      or an iterator/generator of strings (each split on newlines); blank lines are skipped.
    model_prefix: output path without extension.
    vocab_size: number of pieces (including pad/eos/unk and, with byte fallback, 256 byte pieces).
    model_type: "unigram" (T5) or "bpe".
    character_coverage: fraction of characters covered by pieces; the rest use byte fallback.
    byte_fallback: encode unknown characters as UTF-8 byte pieces instead of ``unk``.
    hard_vocab_limit: if False, ``vocab_size`` is a soft limit (small corpora may yield fewer).
    normalization_rule_name: SentencePiece normaliser ("nmt_nfkc" as T5, "nfkc", "identity").
    input_sentence_size: sample at most this many sentences (0 = all).
    split_digits: split numbers into single digits.
    num_threads: trainer threads.
    seed_sentencepiece_size: seed pieces for the unigram trainer.
    user_defined_symbols: pieces always kept whole.
    verbose: print the trainer log.

  Returns:
    Path of the written ``.model`` file.
  """
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top

  if vocab_size <= 3 + (256 if byte_fallback else 0):
    raise ValueError(f"vocab_size={vocab_size} is too small for the special and byte pieces")
  prefix = pathlib.Path(model_prefix)
  prefix.parent.mkdir(parents=True, exist_ok=True)
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=_iter_sentences(text_files_or_iterator),
      model_writer=model,
      vocab_size=vocab_size,
      model_type=model_type,
      character_coverage=character_coverage,
      byte_fallback=byte_fallback,
      hard_vocab_limit=hard_vocab_limit,
      normalization_rule_name=normalization_rule_name,
      input_sentence_size=input_sentence_size,
      shuffle_input_sentence=True,
      split_digits=split_digits,
      num_threads=num_threads,
      seed_sentencepiece_size=seed_sentencepiece_size,
      max_sentence_length=MAX_SENTENCE_CHARS * 4,
      user_defined_symbols=list(user_defined_symbols),
      pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
      pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>",
      minloglevel=0 if verbose else 2,
  )
  model_path = prefix.with_name(prefix.name + ".model")
  model_path.write_bytes(model.getvalue())
  sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
  with open(prefix.with_name(prefix.name + ".vocab"), "w", encoding="utf-8") as f:
    for i in range(sp.get_piece_size()):
      f.write(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n")
  return model_path


class VocabularyError(UserError, FileNotFoundError):
  """A ``data.vocab_path`` that holds no SentencePiece model."""


def resolve_vocab_path(path: str | os.PathLike = "") -> pathlib.Path | str:
  """Returns the model path: ``path`` itself (local or ``gs://``), or the embedded vocabulary."""
  if not str(path):
    return EMBEDDED_VOCAB
  from etils import epath  # pylint: disable=g-import-not-at-top

  resolved = epath.Path(path)
  if not resolved.is_file():
    raise VocabularyError(f"SentencePiece model not found: {path} (data.vocab_path); build one "
                            "with python -m t5like.tools.build_vocab")
  return resolved if isinstance(resolved, pathlib.Path) else str(path)


def load_model_proto(path: str | os.PathLike = "") -> bytes:
  """The serialized SentencePiece model at ``path`` ("" = embedded), local or in a bucket."""
  from etils import epath  # pylint: disable=g-import-not-at-top

  return epath.Path(resolve_vocab_path(path)).read_bytes()


def vocab_size(path: str | os.PathLike = "") -> int:
  """Number of pieces of the SentencePiece model at ``path`` ("" = embedded)."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top

  return spm.SentencePieceProcessor(model_proto=load_model_proto(path)).get_piece_size()


def recorded_extra_ids(path: str | os.PathLike = "") -> int | None:
  """Sentinel ids ``build_vocab --extra_ids`` recorded next to the model (``<prefix>.json``), or
  None when there is no record (the embedded vocabulary, older or foreign models): then any
  ``data.extra_ids`` may be appended by seqio."""
  import json  # pylint: disable=g-import-not-at-top

  from etils import epath  # pylint: disable=g-import-not-at-top

  if not str(path):
    return None
  record = epath.Path(str(path)[:-len(".model")] + ".json" if str(path).endswith(".model")
                      else str(path) + ".json")
  if not record.is_file():
    return None
  try:
    value = json.loads(record.read_text()).get("extra_ids")
  except (ValueError, AttributeError):
    return None
  return int(value) if isinstance(value, int) else None


def get_vocabulary(path: str = "", extra_ids: int = 0) -> "seqio.SentencePieceVocabulary":
  """Returns a ``seqio.SentencePieceVocabulary`` for ``path`` ("" = the embedded vocabulary).

  Args:
    path: a SentencePiece ``.model`` file; "" selects ``EMBEDDED_VOCAB`` (8192 pieces).
    extra_ids: sentinel ids appended after the pieces (T5 span corruption uses 100).
  """
  import seqio  # pylint: disable=g-import-not-at-top  # Slow import: keep it lazy.

  return seqio.SentencePieceVocabulary(str(resolve_vocab_path(path)), extra_ids=extra_ids)
