"""At every decode step the cached logits equal a full forward pass over the sequence so far.

Teacher-forced: fixed continuation tokens are fed through the cache (prefill + one-token steps,
the functions ``generate`` runs) and compared with one training forward over prompt + tokens, per
row of a padded batch of mixed prompt lengths (DecLLM causal, prefix, mixed forward/backward,
GQA, scanned and unrolled; RedLLM with continuous positions, both output-norm scopes); through
the decoder unstacked as ``generate`` runs it on the model's chosen backend, and through the
model's own (scanned or unrolled) stack on the reference backend.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import tiny_model
from numerics import assert_close_to_scale
from t5like.inference import generation as gen
from t5like.inference import steps
from t5like.inference.sampling import SamplingConfig

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24], [30]]
FORCED = np.asarray([[40, 41, 42, 43], [50, 51, 52, 53], [60, 61, 62, 63]], np.int32)


def cached_logits(model, prompts, forced_bm, unstacked: bool = True):
  """Logits [batch, m, vocab]: step 0 after the prompt, step t after forced tokens [:t]
  (``unstacked``: the decoder's layers as ``generate`` runs them, ``steps.decode_layout``)."""
  tokens, lens = gen._pad_inputs(prompts, model.cfg.family, len(prompts))
  m = forced_bm.shape[1]
  plan = gen._Plan(model.cfg.family, tokens.shape[1], m, -1, SamplingConfig())
  graphdef = nnx.graphdef(model)

  @jax.jit
  def run(params, tokens, lens, forced):
    mdl = nnx.merge(graphdef, params)
    if unstacked:
      mdl = steps.decode_layout(mdl)
    logits, cache, step = gen._prefill(mdl, plan, tokens, lens)

    def body(cache, t):
      lg, cache = step(forced[:, t - 1], t, cache)
      return cache, lg

    _, rest = jax.lax.scan(body, cache, jnp.arange(1, m))
    return jnp.concatenate([logits[:, None], jnp.swapaxes(rest, 0, 1)], axis=1)

  return np.asarray(run(nnx.to_pure_dict(nnx.state(model)), tokens, lens, forced_bm))


def full_logits(model, prompts, forced_bm):
  """The same logits from one training-style forward per padded batch."""
  m = forced_bm.shape[1]
  if model.cfg.family == "redllm":
    enc = np.zeros((len(prompts), 32), np.int32)
    for i, p in enumerate(prompts):
      enc[i, :len(p)] = p
    dec = np.concatenate([np.zeros((len(prompts), 1), np.int32), forced_bm[:, :-1]], axis=1)
    return np.asarray(nnx.jit(lambda mdl, b: mdl(b))(
        model, {"encoder_input_tokens": jnp.asarray(enc), "decoder_input_tokens": jnp.asarray(dec)}))
  length = 32
  rows = {k: np.zeros((len(prompts), length), np.int32) for k in
          ("decoder_input_tokens", "decoder_segment_ids", "decoder_causal_attention")}
  for i, p in enumerate(prompts):
    seq = [0] + p + list(forced_bm[i, :-1])
    rows["decoder_input_tokens"][i, :len(seq)] = seq
    rows["decoder_segment_ids"][i, :len(seq)] = 1
    rows["decoder_causal_attention"][i, :len(p) + 1] = 1  # BOS + prompt, as in PrefixLM.
  logits = np.asarray(nnx.jit(lambda mdl, b: mdl(b))(
      model, {k: jnp.asarray(v) for k, v in rows.items()}))
  return np.stack([logits[i, len(p):len(p) + m] for i, p in enumerate(prompts)])


CASES = {
    "decllm_causal_gqa": ("decllm", dict(num_kv_heads=2)),
    "decllm_prefix_mixed_per_head": ("decllm", dict(decoder_attention="prefix",
                                                    mixed_attention="per_head")),
    "decllm_prefix_per_layer_unrolled": ("decllm", dict(decoder_attention="prefix",
                                                        mixed_attention="per_layer",
                                                        scan_layers=False)),
    "decllm_prefix_per_layer_3_scanned": ("decllm", dict(decoder_attention="prefix",
                                                         mixed_attention="per_layer",
                                                         num_layers=3)),
    "decllm_one_layer": ("decllm", dict(num_layers=1)),
    "redllm_per_head_norm": ("redllm", dict(attn_out_norm_scope="per_head")),
    "redllm_all_heads_gqa_mixed": ("redllm", dict(attn_out_norm_scope="all_heads",
                                                  num_kv_heads=2, mixed_attention="per_layer")),
}


@pytest.mark.parametrize("layout", ["generate", "stack"])
@pytest.mark.parametrize("case", list(CASES))
def test_cached_logits_equal_full_forward(case, layout):
  """``generate``: the unstacked decoder (``steps.decode_layout``); ``stack``: the model's own
  stack (scanned or unrolled)."""
  family, overrides = CASES[case]
  model = tiny_model(family, seed=1, **overrides)
  got = cached_logits(model, PROMPTS, FORCED, unstacked=layout == "generate")
  want = full_logits(model, PROMPTS, FORCED)
  for i in range(len(PROMPTS)):
    for t in range(FORCED.shape[1]):
      assert_close_to_scale(got[i, t], want[i, t], err_msg=f"{case} row {i} step {t}")


def test_prefix_prompt_is_bidirectional():
  """The prefix model's first logits depend on the whole prompt through bidirectional attention:
  a causal-prefill stand-in (same weights, decoder_attention='causal') gives different logits."""
  prefix = tiny_model("decllm", seed=1, decoder_attention="prefix")
  causal = tiny_model("decllm", seed=1)
  a = cached_logits(prefix, PROMPTS[:2], FORCED[:2, :1])
  b = cached_logits(causal, PROMPTS[:2], FORCED[:2, :1])
  assert np.max(np.abs(a - b)) > 1e-3 * np.max(np.abs(b))


def test_decode_layout_holds_a_copy_of_each_decoder_layer():
  """``steps.decode_layout``: the decoder's layers as separate modules whose parameters are the
  stacked parameters' slices; everything else (encoder, embedding) the model's own arrays."""
  model = tiny_model("redllm", seed=2, num_kv_heads=2)
  layout = steps.decode_layout(model)
  assert layout.embedding.table.get_value() is model.embedding.table.get_value()
  stacked = jax.tree.leaves(nnx.state(model.decoder.layers))
  assert len(layout.decoder.layers) == model.cfg.num_decoder_layers
  for i, layer in enumerate(layout.decoder.layers):
    for got, want in zip(jax.tree.leaves(nnx.state(layer)), stacked, strict=True):
      np.testing.assert_array_equal(got, np.asarray(want)[i])

