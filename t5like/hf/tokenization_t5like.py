"""The SentencePiece tokenizer of a t5like model for Hugging Face ``transformers``.

Ids are the SentencePiece model's own, as seqio's ``SentencePieceVocabulary`` gives them (pad 0,
eos 1, unk 2, byte fallback, the model's ``nmt_nfkc`` normalisation): no extra ids, no pieces
renumbered. DecLLM tokenizers put its BOS (id 0, seqio's shifted decoder input) in front of every
text (``special_tokens_pattern="bos"``); RedLLM tokenizers add nothing.
"""
from transformers.tokenization_utils_sentencepiece import SentencePieceBackend


class T5LikeTokenizer(SentencePieceBackend):
  model_input_names = ["input_ids", "attention_mask"]

  def __init__(self, vocab_file=None, special_tokens_pattern="none", **kwargs):
    kwargs.setdefault("legacy", True)  # Plain sp.encode: seqio's ids, spaces as the model has them.
    super().__init__(vocab_file=vocab_file, special_tokens_pattern=special_tokens_pattern,
                     **kwargs)

  def convert_tokens_to_string(self, tokens):
    """SentencePiece's own decoding (byte pieces such as ``<0xC3><0xA9>`` join into characters),
    special tokens kept as their text (``<pad>``, ``</s>``) unless skipped by the caller."""
    out, run = [], []
    for token in tokens:
      if token in self.all_special_tokens:
        out += [self.sp_model.decode_pieces(run), token]
        run = []
      else:
        run.append(token)
    return "".join(out + [self.sp_model.decode_pieces(run)])
