"""The switches imported Llama / Qwen3 decoders need (``model.v_norm``, ``model.tie_embeddings``,
``model.scale_logits``): what each changes in the parameters and the logits, their counts,
validation, and cached generation with them equal to full forwards."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import forward, tiny_cfg, tiny_model, tokens
from t5like.config import ConfigError
from t5like.inference import generate
from t5like.models.param_count import analytic_param_count, built_param_count


def params_of(model) -> dict:
  return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def test_v_norm_off_drops_the_v_norm_only():
  on, off = tiny_model(seed=0), tiny_model(seed=0, v_norm=False)
  attn_on, attn_off = params_of(on)["decoder"]["layers"]["attention"], \
      params_of(off)["decoder"]["layers"]["attention"]
  assert set(attn_on) - set(attn_off) == {"v_norm"}
  # RMSNorm(3 v) == RMSNorm(v): scaling V's kernel changes the logits only without the norm.
  batch = {"decoder_input_tokens": tokens((2, 8))}
  base = np.asarray(forward(off, batch))
  attn = off.decoder.layers.attention
  attn.wv[...] = attn.wv[...] * 3.0
  scaled = np.asarray(forward(off, batch))
  assert np.abs(scaled - base).max() > 1e-3  # V is no longer normalised away.
  attn_on = on.decoder.layers.attention
  before = np.asarray(forward(on, batch))
  attn_on.wv[...] = attn_on.wv[...] * 3.0  # RMSNorm(3 v) == RMSNorm(v) (up to eps).
  np.testing.assert_allclose(np.asarray(forward(on, batch)), before, rtol=1e-4, atol=1e-4)


def test_untied_output_and_unscaled_logits():
  tied = tiny_model(seed=0, scale_logits=False)
  untied = tiny_model(seed=0, tie_embeddings=False, scale_logits=False)
  assert params_of(untied)["embedding"]["output"].shape == (97, 32)
  assert "output" not in params_of(tied)["embedding"]
  batch = {"decoder_input_tokens": tokens((2, 8))}
  same = params_of(tied)  # Every parameter of ``tied``, its table as the output table too.
  same["embedding"]["output"] = same["embedding"]["table"]
  state = nnx.state(untied, nnx.Param)
  nnx.replace_by_pure_dict(state, same)
  nnx.update(untied, state)
  np.testing.assert_allclose(np.asarray(forward(untied, batch)),
                             np.asarray(forward(tied, batch)), rtol=1e-5, atol=1e-5)
  scaled = tiny_model(seed=0)  # T5's x / sqrt(d): the same model's logits / sqrt(32).
  np.testing.assert_allclose(np.asarray(forward(scaled, batch)) * 32 ** 0.5,
                             np.asarray(forward(tied, batch)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("overrides", [dict(v_norm=False), dict(tie_embeddings=False),
                                       dict(qkv_norm=False, tie_embeddings=False)])
@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_counts_follow_the_switches(family, overrides):
  cfg = tiny_cfg(family, **overrides)
  assert analytic_param_count(cfg) == built_param_count(cfg)


def test_v_norm_off_needs_qkv_norm():
  with pytest.raises(ConfigError, match="model.v_norm=False"):
    tiny_cfg(qkv_norm=False, v_norm=False)


@pytest.mark.parametrize("family", ["decllm", pytest.param("redllm", marks=pytest.mark.slow)])  # Budget: docs/tests.md
def test_cached_generation_with_the_switches_equals_full_forwards(family):
  """Greedy tokens from the KV-cache decode equal argmax of full forwards (Qwen3-like model:
  Q/K norms only, untied output, unscaled logits)."""
  model = tiny_model(family, seed=2, v_norm=False, tie_embeddings=False, scale_logits=False)
  prompt = [5, 6, 7, 8, 9]
  got = generate(model, [prompt], max_new_tokens=5, eos_id=-1)[0]
  out: list[int] = []
  for _ in range(5):
    if family == "redllm":
      batch = {"encoder_input_tokens": jnp.asarray([prompt]),
               "decoder_input_tokens": jnp.asarray([[0] + out])}
    else:
      batch = {"decoder_input_tokens": jnp.asarray([[0] + prompt + out])}
    out.append(int(jnp.argmax(forward(model, batch)[0, -1])))
  assert got == out
