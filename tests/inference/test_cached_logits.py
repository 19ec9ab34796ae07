"""At every decode step the cached logits equal a full forward pass over the sequence so far.

Teacher-forced: fixed continuation tokens are fed through the cache (prefill + one-token steps,
the functions ``generate`` runs) and compared with one training forward over prompt + tokens, per
row of a padded batch of mixed prompt lengths (DecLLM causal, prefix, mixed forward/backward,
GQA, scanned and unrolled; RedLLM with continuous positions, both output-norm scopes).
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
from t5like.models.layers import TransposedKernel

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24], [30]]
FORCED = np.asarray([[40, 41, 42, 43], [50, 51, 52, 53], [60, 61, 62, 63]], np.int32)


def cached_logits(model, prompts, forced_bm, transpose: bool | None = None):
  """Logits [batch, m, vocab]: step 0 after the prompt, step t after forced tokens [:t]
  (``transpose``: the decode weights' layout, ``steps.decode_weights``)."""
  tokens, lens = gen._pad_inputs(prompts, model.cfg.family, len(prompts))
  m = forced_bm.shape[1]
  plan = gen._Plan(model.cfg.family, tokens.shape[1], m, -1, SamplingConfig())
  graphdef = nnx.graphdef(model)

  @jax.jit
  def run(params, tokens, lens, forced):
    mdl = nnx.merge(graphdef, params)
    weights = steps.decode_weights(mdl, transpose=transpose)
    logits, cache, step = gen._prefill(mdl, weights, plan, tokens, lens)

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
    # The prefill's last layer runs apart from the scanned others (steps._last_self_block).
    "decllm_prefix_per_layer_3_scanned": ("decllm", dict(decoder_attention="prefix",
                                                         mixed_attention="per_layer",
                                                         num_layers=3)),
    "decllm_one_layer": ("decllm", dict(num_layers=1)),
    "redllm_per_head_norm": ("redllm", dict(attn_out_norm_scope="per_head")),
    "redllm_all_heads_gqa_mixed": ("redllm", dict(attn_out_norm_scope="all_heads",
                                                  num_kv_heads=2, mixed_attention="per_layer")),
}


@pytest.mark.parametrize("layout", ["cpu", "accelerator"])
@pytest.mark.parametrize("case", list(CASES))
def test_cached_logits_equal_full_forward(case, layout):
  """``cpu``: the decode weights transposed, with side-by-side input kernels; ``accelerator``:
  the training layout, one product per kernel (also checked on CPU)."""
  family, overrides = CASES[case]
  model = tiny_model(family, seed=1, **overrides)
  got = cached_logits(model, PROMPTS, FORCED, transpose=layout == "cpu")
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


def test_decode_layers_hold_transposed_copies_of_every_kernel():
  """On CPU the decode step's per-layer copies store each dense kernel [out, in] (the layout the
  cached-logits test above runs through), with the same numbers as the stacked parameters; the
  kernels that read the same input (self-attention q | k | v, the MLP's gate | up) side by side
  in one ``InputKernels`` entry and not also in the layer; the logits read the embedding table
  itself."""
  model = tiny_model("redllm", seed=2, num_kv_heads=2)
  weights = steps.decode_weights(model, transpose=True)  # The CPU default, on any platform.
  assert weights.table.w_nk is model.embedding.table.get_value()
  layers = weights.layers
  stacked = model.decoder.layers
  side_by_side = {("self_attention", "qkv"): ("wq", "wk", "wv"),
                  ("mlp", "gate_up"): ("wi_gate", "wi_up")}
  seen = 0
  for i, (layer, inputs) in enumerate(zip(layers, weights.inputs, strict=True)):
    def transposed(name, kname, n):
      want = np.asarray(getattr(getattr(stacked, name), kname).get_value()[i])
      return want.reshape(int(np.prod(want.shape[:n])), -1).T

    for name in ("self_attention", "cross_attention", "mlp"):
      module = getattr(layer, name)
      grouped = {k: kn for (mod, k), kn in side_by_side.items() if mod == name}
      for field, knames in grouped.items():
        got = getattr(inputs, field)
        assert isinstance(got, TransposedKernel) and got.n_contract == 1
        np.testing.assert_array_equal(np.asarray(got.w_nk), np.concatenate(
            [transposed(name, kn, 1) for kn in knames]))
        assert all(getattr(module, kn) is None for kn in knames)  # One copy, not two.
        seen += len(knames)
      for kname, n in type(module).KERNELS.items():
        if any(kname in kn for kn in grouped.values()):
          continue
        got = getattr(module, kname).get_value()
        assert isinstance(got, TransposedKernel) and got.n_contract == n
        np.testing.assert_array_equal(np.asarray(got.w_nk), transposed(name, kname, n))
        seen += 1
  assert seen == len(layers) * (4 + 4 + 3)


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_decode_step_computes_its_rotation_once(family):
  """Fused into each layer's query and key rotations, XLA:CPU computed the step's sin/cos per
  head and layer; the step computes one table for all layers: as many cosines in the compiled
  step of a 3-layer model as of a 1-layer one."""
  def cosines(num_layers):
    model = tiny_model(family, seed=0, **{"num_layers" if family == "decllm" else
                                          "num_decoder_layers": num_layers})
    tokens, lens = gen._pad_inputs(PROMPTS, family, len(PROMPTS))
    plan = gen._Plan(family, tokens.shape[1], 2, -1, SamplingConfig())
    graphdef = nnx.graphdef(model)

    def one_step(params, tokens, lens):
      mdl = nnx.merge(graphdef, params)
      _, cache, step = gen._prefill(mdl, steps.decode_weights(mdl), plan, tokens, lens)
      return step(jnp.ones(len(PROMPTS), jnp.int32), 1, cache)[0]

    hlo = jax.jit(one_step).lower(nnx.to_pure_dict(nnx.state(model)), tokens, lens)
    return hlo.compile().as_text().count(" cosine(")

  one, three = cosines(1), cosines(3)
  assert one == three, (one, three)
