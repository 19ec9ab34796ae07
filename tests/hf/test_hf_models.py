"""Exported models in PyTorch equal t5like: logits (DecLLM causal / prefix / GQA, RedLLM over
several encoder lengths), greedy ``generate()`` token for token with the KV cache, EOS per row,
sampling, and the tokenizer's ids."""
from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

from hf_helpers import make_export
from t5like.data import vocab as vocab_lib
from t5like.data.vocab import get_vocabulary
from t5like.training.restore import restore_model
from t5like.inference import generate
from t5like.tools import export_hf

MODELS = {
    "decllm_causal": ("decllm", dict()),
    "decllm_gqa": ("decllm", dict(num_kv_heads=2)),
    "decllm_prefix": ("decllm", dict(decoder_attention="prefix", num_kv_heads=1)),
    "redllm": ("redllm", dict(num_kv_heads=2)),
    "redllm_all_heads_norm": ("redllm", dict(attn_out_norm_scope="all_heads",
                                             rope_max_wavelength=500.0)),
}
TEXTS = ["The quick brown fox", "Once upon a time, in a land far away there lived",
         "Paris is the capital of", "1 2 3 4"]


@pytest.fixture(scope="module", params=list(MODELS))
def pair(request, tmp_path_factory):
  """(t5like model, HF model, HF tokenizer, name) of one exported checkpoint."""
  family, overrides = MODELS[request.param]
  workdir, hf_dir, _, _ = make_export(str(tmp_path_factory.mktemp(request.param)), family,
                                      seed=len(request.param), **overrides)
  model, _, _ = restore_model(workdir)
  auto = AutoModelForCausalLM if family == "decllm" else AutoModelForSeq2SeqLM
  hf = auto.from_pretrained(hf_dir, trust_remote_code=True, dtype=torch.float32).eval()
  tok = AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=True)
  return model, hf, tok, request.param


def close(got: np.ndarray, want: np.ndarray) -> None:
  """Max abs difference within 1e-4 of the logits' scale (float32, different op orders)."""
  assert got.shape == want.shape
  err = np.abs(got - want).max()
  assert err <= 1e-4 * np.abs(want).max(), (err, np.abs(want).max())


def test_logits_equal_t5likes(pair):
  model, hf, _, name = pair
  rng = np.random.RandomState(0)
  if model.cfg.family == "decllm":
    tokens = rng.randint(3, 8192, (3, 24)).astype(np.int32)
    tokens[:, 0] = 0  # BOS, as seqio's shifted decoder input (and the tokenizer) have it.
    batch = {"decoder_input_tokens": jnp.asarray(tokens)}
    kwargs = {}
    if model.cfg.decoder_attention == "prefix":
      prefix = np.zeros_like(tokens)
      for r, n in enumerate((5, 12, 1)):  # Bidirectional over BOS + a prompt of n - 1 tokens.
        prefix[r, :n] = 1
      batch["decoder_causal_attention"] = jnp.asarray(prefix)
      kwargs["prefix_mask"] = torch.tensor(prefix)
    want = np.asarray(model(batch))
    with torch.no_grad():
      out = hf(torch.tensor(tokens, dtype=torch.long), labels=torch.tensor(tokens).long(),
               **kwargs)
    got = out.logits.numpy()
    logp = want - np.log(np.exp(want.astype(np.float64)).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp[:, :-1], tokens[:, 1:, None], -1).mean()
    assert abs(float(out.loss) - nll) <= 1e-4 * nll  # labels = input_ids, shifted inside.
    if kwargs:  # The prefix matters: without it the same rows score otherwise.
      with torch.no_grad():
        causal = hf(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
      assert np.abs(causal - want).max() > 1e-2
  else:  # Rows of 3, 9 and 17 encoder tokens: continuous positions differ per row.
    enc = np.zeros((3, 17), np.int32)
    for r, n in enumerate((3, 9, 17)):
      enc[r, :n] = rng.randint(3, 8192, n)
    dec = rng.randint(3, 8192, (3, 11)).astype(np.int32)
    dec[:, 0] = 0
    want = np.asarray(model({"encoder_input_tokens": jnp.asarray(enc),
                             "decoder_input_tokens": jnp.asarray(dec)}))
    with torch.no_grad():
      got = hf(input_ids=torch.tensor(enc).long(), attention_mask=torch.tensor(enc != 0).long(),
               decoder_input_ids=torch.tensor(dec).long()).logits.numpy()
  close(got, want)


def _hf_generate(hf, tok, texts, **kwargs):
  """New tokens per row, cut before EOS (1)."""
  batch = tok(texts, return_tensors="pt", padding=True)
  with torch.no_grad():
    out = hf.generate(**batch, **kwargs).numpy()
  start = 1 if hf.config.is_encoder_decoder else batch["input_ids"].shape[1]
  rows = []
  for row in out[:, start:].tolist():
    rows.append(row[:row.index(1)] if 1 in row else row)
  return rows, out[:, start:]


def test_greedy_generate_equals_t5likes_tokens(pair):
  model, hf, tok, _ = pair
  prompts = [get_vocabulary("").encode(t) for t in TEXTS]
  want = generate(model, prompts, max_new_tokens=32, eos_id=-1)
  got, raw = _hf_generate(hf, tok, TEXTS, max_new_tokens=32, do_sample=False,
                          eos_token_id=None, min_new_tokens=32)
  assert raw.shape[1] == 32
  assert raw.tolist() == want
  no_cache, _ = _hf_generate(hf, tok, TEXTS, max_new_tokens=8, do_sample=False,
                             use_cache=False, eos_token_id=None)
  assert [r[:8] for r in want] == no_cache  # The KV cache changes nothing.


def test_eos_stops_each_row_on_its_own(pair):
  model, hf, tok, _ = pair
  prompts = [get_vocabulary("").encode(t) for t in TEXTS]
  free = generate(model, prompts, max_new_tokens=32, eos_id=-1)
  eos = free[0][3]  # A token row 0 makes 4th: it stops there, the others when they make it.
  want = generate(model, prompts, max_new_tokens=32, eos_id=eos)
  batch = tok(TEXTS, return_tensors="pt", padding=True)
  with torch.no_grad():
    out = hf.generate(**batch, max_new_tokens=32, do_sample=False, eos_token_id=eos).numpy()
  start = 1 if hf.config.is_encoder_decoder else batch["input_ids"].shape[1]
  for r, row in enumerate(out[:, start:].tolist()):
    n = len(want[r])
    assert row[:n] == want[r]
    if n < len(row):  # Stopped: EOS, then only padding.
      assert row[n] == eos and set(row[n + 1:]) <= {0}
  assert len(want[0]) <= 3 < max(len(w) for w in want)


def test_sampling_is_seeded_and_top_k_1_is_greedy(pair):
  _, hf, tok, _ = pair
  greedy, _ = _hf_generate(hf, tok, TEXTS, max_new_tokens=12, do_sample=False)
  top1, _ = _hf_generate(hf, tok, TEXTS, max_new_tokens=12, do_sample=True, top_k=1)
  assert top1 == greedy
  torch.manual_seed(0)
  a, _ = _hf_generate(hf, tok, TEXTS, max_new_tokens=12, do_sample=True, temperature=5.0)
  torch.manual_seed(0)
  b, _ = _hf_generate(hf, tok, TEXTS, max_new_tokens=12, do_sample=True, temperature=5.0)
  assert a == b and a != greedy  # Hot sampling leaves the greedy path.


def test_first_step_scores_are_t5likes_last_logits(pair):
  """generate()'s prefill (scores of the first new token) is t5like's forward on the prompt."""
  model, hf, tok, _ = pair
  prompt = get_vocabulary("").encode(TEXTS[1])
  if model.cfg.family == "decllm":
    batch = {"decoder_input_tokens": jnp.asarray([[0] + prompt])}
    if model.cfg.decoder_attention == "prefix":  # generate() makes the prompt the prefix.
      batch["decoder_causal_attention"] = jnp.ones_like(batch["decoder_input_tokens"])
  else:
    batch = {"encoder_input_tokens": jnp.asarray([prompt]),
             "decoder_input_tokens": jnp.zeros((1, 1), jnp.int32)}
  want = np.asarray(model(batch))[:, -1]
  with torch.no_grad():
    out = hf.generate(**tok(TEXTS[1:2], return_tensors="pt"), max_new_tokens=1,
                      do_sample=False, output_scores=True, return_dict_in_generate=True)
  close(out.scores[0].numpy(), want)


@pytest.fixture(scope="module", params=["decllm", "redllm"])
def tokenizer(request, tmp_path_factory):
  """The exported tokenizer files of one family, loaded by AutoTokenizer."""
  out = tmp_path_factory.mktemp(request.param)
  (out / "tokenizer.model").write_bytes(vocab_lib.load_model_proto(""))
  (out / "tokenization_t5like.py").write_text(
      (export_hf.HF_SOURCES / "tokenization_t5like.py").read_text())
  for name, obj in export_hf.tokenizer_files(request.param).items():
    (out / name).write_text(json.dumps(obj))
  return request.param, AutoTokenizer.from_pretrained(str(out), trust_remote_code=True)


def test_tokenizer_ids_are_seqio_vocabularys(tokenizer):
  family, tok = tokenizer
  vocab = get_vocabulary("")
  text = ("  Leading spaces,\ttabs\nnew lines;  double  spaces. Ünïcödé: ÆØÅ ß, 中文字符, "
          "עברית, emoji 🙂🚀, maths ∑∫√ and rare bytes \u0378\u2fd5 end  ")
  ids = vocab.encode(text)
  assert any(vocab.tokenizer.IdToPiece(i).startswith("<0x") for i in ids)  # Byte fallback.
  bos = [0] if family == "decllm" else []
  assert tok(text).input_ids == bos + ids
  assert tok(text, add_special_tokens=False).input_ids == ids
  assert tok.decode(ids) == vocab.decode(ids)
  assert tok.decode([0] + ids + [1], skip_special_tokens=True) == vocab.decode(ids)
  assert tok.decode([0]) == "<pad>"  # lm-eval looks for a BOS text to avoid adding a second.
  assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)
  assert len(tok) == vocab.vocab_size == 8192  # No extra ids.


def _new_tokens(hf, ids, out):
  start = 1 if hf.config.is_encoder_decoder else ids.shape[1]
  return out[:, start:].tolist()


def test_generate_without_a_mask_equals_t5likes(pair):
  """``generate(input_ids)`` with no attention mask — one prompt at a time, and a padded batch —
  gives t5like's greedy tokens, as with the tokenizer's mask: DecLLM's BOS (id 0, also the pad id)
  is not mistaken for padding. DecLLM batches are left-padded (generation continues after each
  row's last token), RedLLM's encoder inputs either way."""
  model, hf, tok, _ = pair
  encdec = hf.config.is_encoder_decoder
  prompts = [get_vocabulary("").encode(t) for t in TEXTS]
  want = generate(model, prompts, max_new_tokens=12, eos_id=-1)
  kwargs = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False, eos_token_id=None)
  with torch.no_grad():
    for text, w in zip(TEXTS, want):
      ids = tok(text, return_tensors="pt").input_ids
      assert _new_tokens(hf, ids, hf.generate(ids, **kwargs)) == [w]
    for side in ("left", "right") if encdec else ("left",):
      tok.padding_side = side
      try:
        batch = tok(TEXTS, return_tensors="pt", padding=True)
      finally:
        tok.padding_side = "right" if encdec else "left"
      assert (batch.attention_mask == 0).any()  # Padding there to be told from the BOS.
      ids = batch.input_ids
      assert _new_tokens(hf, ids, hf.generate(ids, **kwargs)) == want, side
      assert _new_tokens(hf, ids, hf.generate(**batch, **kwargs)) == want, side
  if not encdec:  # A forward without a mask still attends everywhere, leading zeros included
    tokens = np.asarray([[0, 0, 0, 17, 230, 4001, 9, 77]], np.int32)  # (lm-eval's scoring calls).
    batch = {"decoder_input_tokens": jnp.asarray(tokens)}
    if model.cfg.decoder_attention == "prefix":  # No prefix flagged: causal.
      batch["decoder_causal_attention"] = jnp.zeros_like(batch["decoder_input_tokens"])
    with torch.no_grad():
      close(hf(torch.tensor(tokens).long()).logits.numpy(), np.asarray(model(batch)))

