"""Generation's prefill runs the attention core training uses: a model built with a fused core
(``model.attention_impl="splash"``, Pallas interpret mode on CPU) sends every prefill attention
call (DecLLM's prompt, RedLLM's encoder) through that core under the training mask, over the
prompt's own keys; the one-token decode steps over the cache stay on the reference core; and the
generated tokens are those of the same weights on the reference core (which CPU's ``auto``
takes, so CPU generation is unchanged)."""
from __future__ import annotations

import jax
import pytest

from helpers import tiny_model
from t5like.inference import generate
from t5like.inference import generation as gen
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
