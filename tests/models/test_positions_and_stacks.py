"""RoPE relativity, RedLLM continuous positions, scanned vs unrolled stacks, tied embeddings."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import forward, tiny_cfg, tiny_model, tokens
from numerics import assert_close_to_scale, assert_trees_close_to_scale
from t5like.models import build_model, cross_entropy_with_z_loss
from t5like.models.rotary import apply_rope


def test_rope_scores_depend_only_on_distance():
  q, k = jax.random.normal(jax.random.key(0), (2, 1, 1, 1, 16))
  pos = lambda p: jnp.array([[p]])
  score = lambda pq, pk: float(jnp.sum(apply_rope(q, pos(pq), 1e4) * apply_rope(k, pos(pk), 1e4)))
  # Against |q||k| (the size of the terms summed): a score near zero has no relative precision.
  scale = float(jnp.linalg.norm(q) * jnp.linalg.norm(k))
  assert abs(score(7, 3) - score(107, 103)) <= 1e-5 * scale
  assert abs(score(7, 3) - score(7, 5)) > 1e-2 * scale


def test_redllm_default_decoder_positions_continue_after_encoder_length():
  model = tiny_model("redllm")
  enc = jnp.array([[5, 6, 7, 0, 0], [5, 6, 7, 8, 9]])  # Encoder lengths 3 and 5.
  batch = {"encoder_input_tokens": enc, "decoder_input_tokens": tokens((2, 4))}
  positions = model.decoder_positions(batch, model.encode(batch))
  np.testing.assert_array_equal(positions, [[3, 4, 5, 6], [5, 6, 7, 8]])
  restart = tiny_model("redllm", continuous_positions=False)
  np.testing.assert_array_equal(restart.decoder_positions(batch, restart.encode(batch))[0],
                                [0, 1, 2, 3])


def _redllm_batch(shift=0):
  enc, dec = tokens((1, 6), 5), tokens((1, 5), 6)
  return {"encoder_input_tokens": enc, "decoder_input_tokens": dec,
          "encoder_segment_ids": jnp.ones_like(enc), "decoder_segment_ids": jnp.ones_like(dec),
          "encoder_positions": jnp.arange(6)[None] + shift,
          "decoder_positions": jnp.arange(6, 11)[None] + shift}


def test_redllm_outputs_invariant_to_a_global_position_shift():
  model = tiny_model("redllm")
  # float32 RoPE angles near position 1000 carry ~6e-5 rad of rounding, so the shift is invisible
  # up to ~1e-4 of the logits' scale (and a real position bug moves them by O(scale)).
  assert_close_to_scale(forward(model, _redllm_batch(shift=1000)), forward(model, _redllm_batch()),
                        rel=1e-3)


def test_cross_attention_rope_uses_decoder_to_encoder_distance():
  model = tiny_model("redllm")
  batch = _redllm_batch()
  restarted = {**batch, "decoder_positions": jnp.arange(5)[None]}  # seqio's restart-at-0.
  assert float(jnp.abs(forward(model, batch) - forward(model, restarted)).max()) > 1e-3
  # Without cross-attention RoPE, only the decoder self-attention sees positions: shifting the
  # decoder positions alone is then invisible.
  norope = tiny_model("redllm", cross_attention_rope=False)
  assert_close_to_scale(forward(norope, restarted), forward(norope, batch), rel=1e-4)


# Dropout on the DecLLM case: its random draws double a RedLLM gradient's compile time (~9 s of
# the suite), and the per-layer keys come from the layer stack both families share.
@pytest.mark.parametrize("family,mixed,dropout", [("decllm", "per_head", 0.3),
                                                   ("redllm", "per_layer", 0.0)])
def test_scanned_equals_unrolled_and_remat_keeps_values(family, mixed, dropout):
  """Same loss and gradients scanned, unrolled and rematerialised; with dropout, recomputed
  layers draw the same masks as the forward pass."""
  batch = {"decoder_input_tokens": tokens((2, 6)), "encoder_input_tokens": tokens((2, 5), 1),
           "decoder_target_tokens": tokens((2, 6), 2)}
  rng = jax.random.key(3) if dropout else None
  outs, grads = [], []
  for scan, remat in ((True, "none"), (False, "none"), (True, "full"), (True, "dots_no_batch")):
    model = tiny_model(family, mixed_attention=mixed, scan_layers=scan, remat_policy=remat,
                       dropout_rate=dropout)
    graphdef, params = nnx.split(model, nnx.Param)

    def loss(p, rng=rng):
      logits = nnx.merge(graphdef, p)(batch, dropout_rng=rng)
      return cross_entropy_with_z_loss(logits, batch["decoder_target_tokens"], None, 1e-4).loss

    value, g = jax.jit(jax.value_and_grad(loss))(params)  # Half the time of running eagerly.
    outs.append(value)
    grads.append(g)
  if dropout:  # The masks are really drawn.
    assert abs(float(jax.jit(loss)(params, None)) - float(outs[0])) > 1e-3
  for value, g in zip(outs[1:], grads[1:]):  # Same math, other summation orders: see numerics.
    assert_close_to_scale(value, outs[0])
    assert_trees_close_to_scale(g, grads[0])


def test_per_layer_mixing_differs_from_bidirectional():
  batch = {"encoder_input_tokens": tokens((1, 6), 1), "decoder_input_tokens": tokens((1, 4))}
  a = forward(tiny_model("redllm"), batch)
  b = forward(tiny_model("redllm", mixed_attention="per_layer"), batch)
  assert float(jnp.abs(a - b).max()) > 1e-4


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_embeddings_are_one_tied_array(family):
  model = tiny_model(family)
  params = nnx.state(model, nnx.Param)
  vocab_sized = [p for p, v in nnx.to_flat_state(params) if 97 in v.get_value().shape]
  assert vocab_sized == [("embedding", "table")]
  # The one table receives gradient from the input embedding and from the output layer.
  graphdef, params = nnx.split(model, nnx.Param)
  batch = {"decoder_input_tokens": jnp.array([[3, 4]]), "encoder_input_tokens": jnp.array([[5]])}

  def out_logit(p):
    return nnx.merge(graphdef, p)(batch)[0, -1, 50]

  g = jax.grad(out_logit)(params)["embedding"]["table"].get_value()
  assert float(jnp.abs(g[50]).sum()) > 0  # Output row used as the logit projection.
  assert float(jnp.abs(g[3]).sum()) > 0  # Input row used as an embedding.


def test_dropout_only_with_a_key():
  model = tiny_model("decllm", dropout_rate=0.3)
  batch = {"decoder_input_tokens": tokens((1, 6))}
  np.testing.assert_array_equal(forward(model, batch), forward(model, batch))
  a = model(batch, dropout_rng=jax.random.key(0))
  b = model(batch, dropout_rng=jax.random.key(1))
  assert float(jnp.abs(a - b).max()) > 1e-4


def test_z_loss_and_weights():
  logits = jnp.array([[[2.0, 0.0, 0.0], [0.0, 3.0, 0.0]]])
  targets = jnp.array([[0, 2]])
  terms = cross_entropy_with_z_loss(logits, targets, jnp.array([[1.0, 0.0]]), z_loss=0.5)
  log_z = float(jax.nn.logsumexp(logits[0, 0]))
  assert float(terms.cross_entropy) == pytest.approx(log_z - 2.0, rel=1e-6)
  assert float(terms.z_loss) == pytest.approx(0.5 * log_z ** 2, rel=1e-6)
  assert float(terms.weight) == 1.0 and float(terms.correct) == 1.0


def test_accuracy_counts_targets_with_the_largest_logit():
  """``correct`` counts weighted tokens whose target logit is the largest (ties count as hits),
  the argmax hits of random logits."""
  logits = jax.random.normal(jax.random.key(0), (3, 5, 11))
  targets = jax.random.randint(jax.random.key(1), (3, 5), 0, 11)
  targets = targets.at[:, :2].set(jnp.argmax(logits[:, :2], -1))  # Some hits for sure.
  weights = jnp.ones((3, 5)).at[0, 0].set(0.0)
  hits = (jnp.argmax(logits, -1) == targets) * weights
  terms = cross_entropy_with_z_loss(logits, targets, weights, z_loss=0.0)
  assert float(terms.correct) == float(hits.sum()) >= 5
  tie = cross_entropy_with_z_loss(jnp.array([[[1.0, 3.0, 3.0]]]), jnp.array([[2]]), None, 0.0)
  assert float(tie.correct) == 1.0
