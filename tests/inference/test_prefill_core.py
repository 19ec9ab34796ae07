"""Generation's prefill runs the attention core training uses: a model built with a fused core
(``model.attention_impl="splash"``, Pallas interpret mode on CPU) sends every prefill attention
call (DecLLM's prompt, RedLLM's encoder) through that core under the training mask, over the
prompt's own keys; the one-token decode steps over the cache stay on the reference core; and the
generated tokens are those of the same weights on the reference core (which CPU's ``auto``
takes, so CPU generation is unchanged). cuDNN, which counts lengths from a row's start, never
gets the left-padded prompts: a cuDNN model prefills on the reference core, and a left-padded
row handed to the cuDNN core is NaN, never attended silently."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import tiny_model
from t5like.inference import generate
from t5like.inference import generation as gen
from t5like.models import masks
from t5like.ops import fused_attention

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]]
NEW = 5


@pytest.mark.parametrize("family, overrides, kind", [
    ("decllm", {}, "causal"),
    ("decllm", {"decoder_attention": "prefix"}, "prefix"),
    ("redllm", {}, "bidirectional"),
])
def test_prefill_takes_the_training_core_and_decode_the_reference_core(
    family, overrides, kind, monkeypatch):
  calls = []
  real = fused_attention.attend

  def spy(impl, q_bthk, k_bsgk, v_bsgk, spec, **kwargs):
    calls.append((impl, spec.kind, q_bthk.shape[1], k_bsgk.shape[1]))
    return real(impl, q_bthk, k_bsgk, v_bsgk, spec, **kwargs)

  monkeypatch.setattr(fused_attention, "attend", spy)
  monkeypatch.setattr(gen, "_COMPILED", {})
  jax.clear_caches()  # Trace afresh, so the spy sees every call.
  reference = tiny_model(family, seed=4, **overrides)
  assert reference.cfg.attention_impl == "reference"  # CPU's `auto`.
  want = generate(reference, PROMPTS, max_new_tokens=NEW, eos_id=-1)
  assert not calls  # The reference core takes a materialised mask, never the fused dispatch.

  fused = tiny_model(family, seed=4, attention_impl="splash", **overrides)
  got = generate(fused, PROMPTS, max_new_tokens=NEW, eos_id=-1)
  assert got == want and all(len(row) == NEW for row in got)
  # One call per traced layer (DecLLM's generation layers are unstacked, RedLLM's encoder is
  # scanned: traced once), all of the prompt's length against its own keys (the training mask),
  # none of one query over the cache (the decode steps).
  assert len(calls) == (fused.cfg.num_layers if family == "decllm" else 1), calls
  prompt_len = calls[0][2]
  assert prompt_len >= max(map(len, PROMPTS))
  assert all(c == ("splash", kind, prompt_len, prompt_len) for c in calls), calls


def test_a_cudnn_model_prefills_left_padded_prompts_on_the_reference_core(monkeypatch):
  calls = []
  monkeypatch.setattr(fused_attention, "attend", lambda *a, **k: calls.append(a[0]))
  monkeypatch.setattr(gen, "_COMPILED", {})
  jax.clear_caches()
  overrides = dict(dtype="bfloat16", num_kv_heads=2)
  want = generate(tiny_model("decllm", seed=4, **overrides), PROMPTS, max_new_tokens=NEW,
                  eos_id=-1)
  cudnn = tiny_model("decllm", seed=4, attention_impl="cudnn", **overrides)
  assert cudnn.cfg.attention_impl == "cudnn"
  assert generate(cudnn, PROMPTS, max_new_tokens=NEW, eos_id=-1) == want and not calls


def test_the_cudnn_core_gives_nan_for_a_row_padded_first():
  """Through XLA's implementation of the same call (the GPU runs cuDNN's): the row whose
  padding comes first is NaN, the right-padded row is attended."""
  r = jax.random.split(jax.random.key(2), 3)
  q, k, v = (jax.random.normal(x, (2, 8, 2, 8)) for x in r)
  seg = jnp.array([[0, 0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0, 0]])
  out = np.asarray(fused_attention.cudnn_attention(q, k, v, masks.MaskSpec(seg, seg, "causal"),
                                                   implementation="xla"))
  assert np.isnan(out[0]).all() and np.isfinite(out[1]).all()
