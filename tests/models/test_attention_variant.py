"""An attention change is made in one place: a score variant (``model.attention_logit_soft_cap``,
``cap * tanh(score / cap)``) changes training logits, gradients and generated tokens on the
reference core, and each fused core computes it (splash) or refuses it with an error naming it
(cuDNN, plain and packed) — never the old formula. The files such a change touches are those
docs/architecture.md lists under "Where to change what"."""
from __future__ import annotations

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import forward, tiny_cfg, tokens
from numerics import assert_close_to_scale
from t5like import ops
from t5like.config import ConfigError
from t5like.inference import SamplingConfig, generate
from t5like.models import build_model, masks
from t5like.ops import fused_attention
from t5like.ops.reference import dot_product_attention

CAP = 0.5  # Small against the tiny models' scores: the cap bites.


def _batch(family):
  if family == "decllm":  # The first 5 tokens: the prefix of a PrefixLM.
    return {"decoder_input_tokens": tokens((2, 12)),
            "decoder_causal_attention": jnp.array([[1] * 5 + [0] * 7] * 2)}
  return {"encoder_input_tokens": tokens((2, 12), 1), "decoder_input_tokens": tokens((2, 6), 2)}


def _logits_and_grads(family, **overrides):
  model = build_model(tiny_cfg(family, **overrides), nnx.Rngs(3))
  graphdef, params = nnx.split(model)
  batch = _batch(family)

  def loss(p):
    logits = nnx.merge(graphdef, p)(batch)
    return jnp.mean(jax.nn.log_softmax(logits)[..., 7]), logits

  (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return model, logits, grads


@pytest.mark.parametrize("family, overrides", [  # The prefix mask: -m slow (docs/tests.md).
    ("decllm", {}), pytest.param("decllm", {"decoder_attention": "prefix"}, marks=pytest.mark.slow), ("redllm", {})])
def test_the_cap_changes_training_and_generation(family, overrides):
  plain, logits, grads = _logits_and_grads(family, **overrides)
  capped, logits_c, grads_c = _logits_and_grads(family, attention_logit_soft_cap=CAP, **overrides)
  assert capped.cfg.attention_impl == "reference"  # This CPU: the reference core.
  assert not np.allclose(logits_c, logits, atol=1e-3)
  changed = [not np.allclose(a, b, rtol=1e-3, atol=1e-6) for a, b in zip(
      jax.tree.leaves(nnx.to_pure_dict(grads_c)), jax.tree.leaves(nnx.to_pure_dict(grads)))]
  assert sum(changed) > len(changed) // 2, changed
  prompts = [list(map(int, r)) for r in np.asarray(tokens((6, 5), 4))]
  sampled = dict(max_new_tokens=8, eos_id=-1, sampling=SamplingConfig(temperature=1.0),
                 rng=jax.random.key(0))  # The same draws: a token moves where its logits do.
  assert generate(capped, prompts, **sampled) != generate(plain, prompts, **sampled)
  # The KV-cache decode computes the capped scores: its greedy tokens are full forwards'.
  got = generate(capped, prompts[:1], max_new_tokens=2, eos_id=-1)
  assert got == [_greedy_by_full_forwards(capped, prompts[0], 2)]


def _greedy_by_full_forwards(model, prompt, new):
  out = []
  for _ in range(new):
    if model.cfg.family == "decllm":  # The prompt (with BOS) is the prefix of a PrefixLM.
      seq = [0] + prompt + out
      logits = forward(model, {"decoder_input_tokens": jnp.asarray([seq]),
                               "decoder_causal_attention": jnp.asarray(
                                   [[1] * (len(prompt) + 1) + [0] * len(out)])})
    else:
      logits = forward(model, {"encoder_input_tokens": jnp.asarray([prompt]),
                               "decoder_input_tokens": jnp.asarray([[0] + out])})
    out.append(int(jnp.argmax(logits[0, -1])))
  return out


def _qkv(b, t, s, h, g, seed=0):
  r = jax.random.split(jax.random.key(seed), 3)
  return (4 * jax.random.normal(r[0], (b, t, h, 16)), 4 * jax.random.normal(r[1], (b, s, g, 16)),
          jax.random.normal(r[2], (b, s, g, 16)))


@pytest.mark.backends("cpu", "tpu")  # Splash: interpret mode on CPU, a TPU kernel.
@pytest.mark.parametrize("kind", ["causal", "prefix", "cross"])
def test_splash_computes_the_cap(kind):
  t, s = 96, (160 if kind == "cross" else 96)
  q, k, v = _qkv(2, t, s, 4, 2)
  qseg = jnp.array([[1] * 40 + [2] * 50 + [0] * 6, [1] * 96])
  kvseg = qseg if kind != "cross" else jnp.array([[1] * 70 + [2] * 80 + [0] * 10, [1] * 160])
  prefix = jnp.array([[1] * 10 + [0] * 30 + [1] * 25 + [0] * 31, [1] * 48 + [0] * 48])
  spec = masks.MaskSpec(qseg, kvseg, kind, prefix if kind == "prefix" else None)
  mask = masks.materialize(spec)
  out = fused_attention.splash_attention(q, k, v, spec, soft_cap=CAP)
  assert_close_to_scale(out, dot_product_attention(q, k, v, mask, soft_cap=CAP))
  plain = dot_product_attention(q, k, v, mask)
  assert not np.allclose(out, plain, atol=1e-2)  # Not the old formula.


def test_splash_in_the_model_computes_the_cap():
  """The whole model on splash (interpret mode) against the reference core, both capped."""
  _, ref, _ = _logits_and_grads("decllm", attention_logit_soft_cap=CAP)
  _, got, _ = _logits_and_grads("decllm", attention_logit_soft_cap=CAP, attention_impl="splash")
  assert_close_to_scale(got, ref)


@pytest.mark.parametrize("slots", [1, 4])
def test_cudnn_refuses_the_cap(slots):
  with pytest.raises(ConfigError, match="attention_logit_soft_cap"):
    tiny_cfg("decllm", dtype="bfloat16", attention_impl="cudnn", attention_logit_soft_cap=CAP)
  q, k, v = (x.astype(jnp.bfloat16) for x in _qkv(2, 16, 16, 2, 2))
  ids = jnp.ones((2, 16), jnp.int32)
  with pytest.raises(ValueError, match="attention_logit_soft_cap"):
    fused_attention.cudnn_attention(q, k, v, masks.MaskSpec(ids, ids, "causal"),
                                    max_segments_per_row=slots, soft_cap=CAP,
                                    implementation="xla")
  # ``auto`` on a Hopper GPU falls back to the reference core, saying why.
  cfg = tiny_cfg("decllm", dtype="bfloat16", attention_logit_soft_cap=CAP)
  hopper = types.SimpleNamespace(devices=np.array(
      [types.SimpleNamespace(platform="gpu", compute_capability="9.0")]))
  core, reason = ops.choose_attention(cfg, hopper)
  assert core == "reference" and "attention_logit_soft_cap" in reason
  plain = dataclasses.replace(cfg, attention_logit_soft_cap=0.0)
  assert ops.choose_attention(plain, hopper)[0] == "cudnn"


def test_the_export_refuses_the_cap():
  from t5like.tools import export_hf
  with pytest.raises(export_hf.ExportError, match="attention_logit_soft_cap"):
    export_hf.hf_config(tiny_cfg("decllm", attention_logit_soft_cap=CAP))


def test_attention_maps_are_the_capped_models():
  """Attention analysis reads the model's own probabilities: its layer walk reproduces the
  capped model's logits, and the maps differ from the plain model's."""
  from t5like.evaluation import attention_analysis as aa
  batch = _batch("decllm")
  capped = build_model(tiny_cfg("decllm", attention_logit_soft_cap=CAP), nnx.Rngs(3))
  maps = aa.attention_maps(capped, batch)
  logits = capped.embedding.logits(capped.final_norm(jnp.asarray(maps[-1].hidden_btd)))
  assert_close_to_scale(logits, capped(batch))
  plain = aa.attention_maps(build_model(tiny_cfg("decllm"), nnx.Rngs(3)), batch)
  assert not np.allclose(maps[0].probs_bhts, plain[0].probs_bhts, atol=1e-3)
