"""Causality, bidirectionality and packing isolation, measured on model outputs."""
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import forward, tiny_model, tokens


def _changed_positions(a, b, atol=1e-6):
  return np.nonzero(np.abs(np.asarray(a) - np.asarray(b)).max(axis=-1)[0] > atol)[0]


def test_decllm_is_causal():
  model = tiny_model("decllm")
  x = tokens((1, 10))
  base = forward(model, {"decoder_input_tokens": x})
  for t in (0, 4, 9):
    y = forward(model, {"decoder_input_tokens": x.at[0, t].set((x[0, t] + 1) % 97)})
    changed = _changed_positions(base, y)
    assert changed.min() == t, (t, changed)  # Nothing before t moves; position t itself does.


def test_decllm_prefix_is_bidirectional_inside_prefix_only():
  model = tiny_model("decllm", decoder_attention="prefix")
  x = tokens((1, 10))
  prefix = jnp.array([[1] * 4 + [0] * 6])
  run = lambda toks: forward(model, {"decoder_input_tokens": toks,
                                     "decoder_causal_attention": prefix})
  base = run(x)
  assert _changed_positions(base, run(x.at[0, 3].set(5))).min() == 0  # Prefix sees later prefix.
  assert _changed_positions(base, run(x.at[0, 7].set(5))).min() == 7  # Targets stay causal.
  with pytest.raises(ValueError, match="decoder_causal_attention"):
    forward(model, {"decoder_input_tokens": x})


def test_redllm_decoder_causal_and_encoder_bidirectional():
  model = tiny_model("redllm")
  enc, dec = tokens((1, 8), 1), tokens((1, 9), 2)
  run = lambda e, d: forward(model, {"encoder_input_tokens": e, "decoder_input_tokens": d})
  base = run(enc, dec)
  assert _changed_positions(base, run(enc, dec.at[0, 5].set(4))).min() == 5
  # Changing the last encoder token changes every decoder output (cross-attention) ...
  assert len(_changed_positions(base, run(enc.at[0, 7].set(4), dec))) == 9
  # ... and the first encoder output (the encoder is bidirectional).
  e0 = model.encode({"encoder_input_tokens": enc}).encoded_bsd
  e1 = model.encode({"encoder_input_tokens": enc.at[0, 7].set(4)}).encoded_bsd
  assert float(jnp.abs(e0[0, 0] - e1[0, 0]).max()) > 1e-4


def _packed_dec(x):
  seg = jnp.array([[1] * 4 + [2] * 5 + [3] * 3 + [0] * 2])
  pos = jnp.array([[0, 1, 2, 3, 0, 1, 2, 3, 4, 0, 1, 2, 0, 0]])
  return {"decoder_input_tokens": x, "decoder_segment_ids": seg, "decoder_positions": pos}


@pytest.mark.parametrize("attention", ["causal", "prefix"])
def test_decllm_packing_isolation(attention):
  model = tiny_model("decllm", decoder_attention=attention)
  x = tokens((1, 14))
  batch = _packed_dec(x)
  batch["decoder_causal_attention"] = jnp.array([[1, 1, 0, 0, 1, 1, 1, 0, 0, 1, 0, 0, 0, 0]])
  base = forward(model, batch)
  for t, segment in ((3, range(0, 4)), (4, range(4, 9)), (11, range(9, 12))):
    changed = _changed_positions(
        base, forward(model, {**batch, "decoder_input_tokens": x.at[0, t].set(7)}))
    assert set(changed) <= set(segment), (t, changed)


def test_redllm_packing_isolation_through_all_attentions():
  model = tiny_model("redllm")
  enc, dec = tokens((1, 9), 3), tokens((1, 10), 4)
  batch = {
      "encoder_input_tokens": enc,
      "encoder_segment_ids": jnp.array([[1, 1, 1, 1, 2, 2, 2, 0, 0]]),
      "encoder_positions": jnp.array([[0, 1, 2, 3, 0, 1, 2, 0, 0]]),
      "decoder_input_tokens": dec,
      "decoder_segment_ids": jnp.array([[1, 1, 1, 2, 2, 2, 2, 2, 0, 0]]),
      "decoder_positions": jnp.array([[4, 5, 6, 3, 4, 5, 6, 7, 0, 0]]),  # Continuous.
  }
  base = forward(model, batch)
  seg1, seg2 = set(range(0, 3)), set(range(3, 8))
  # Encoder token of segment 1 -> only segment-1 decoder outputs (encoder + cross-attention).
  changed = _changed_positions(
      base, forward(model, {**batch, "encoder_input_tokens": enc.at[0, 2].set(9)}))
  assert set(changed) and set(changed) <= seg1
  changed = _changed_positions(
      base, forward(model, {**batch, "encoder_input_tokens": enc.at[0, 5].set(9)}))
  assert set(changed) and set(changed) <= seg2
  # Decoder token of segment 2 -> only later segment-2 outputs (decoder self-attention).
  changed = _changed_positions(
      base, forward(model, {**batch, "decoder_input_tokens": dec.at[0, 4].set(9)}))
  assert set(changed) == set(range(4, 8))
