"""Shared-parameter RedLLM (T5's "encoder-decoder, shared"): one copy of the self-attention/MLP
arrays read by both stacks, gradients of both uses summed into them, exact parameter count, and
the same FLOPs as the unshared model (same computation, fewer arrays)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from t5like.config import ConfigError
from t5like.models import param_count
from t5like.training import flops
from helpers import tiny_cfg, tokens

SHARED = ("pre_attention_norm", "attention", "pre_mlp_norm", "mlp")  # Encoder layer names.
DECODER_OWN = {"pre_attention_norm": "pre_self_attention_norm", "attention": "self_attention",
               "pre_mlp_norm": "pre_mlp_norm", "mlp": "mlp"}


def _batch():
  b, s, t = 2, 6, 5
  dec = tokens((b, t), seed=2)
  return {"encoder_input_tokens": tokens((b, s), seed=1),
          "decoder_input_tokens": jnp.concatenate([jnp.zeros((b, 1), jnp.int32), dec[:, :-1]], 1),
          "decoder_target_tokens": dec}


def _models(scan=True):
  """(shared model, unshared model whose decoder self-attention/MLP copy the encoder's)."""
  from t5like.models import build_model
  shared = build_model(tiny_cfg("redllm", shared_encoder_decoder=True, scan_layers=scan),
                       nnx.Rngs(0))
  plain = build_model(tiny_cfg("redllm", scan_layers=scan), nnx.Rngs(1))
  enc, own, dec = shared.encoder.layers, shared.decoder.layers, plain.decoder.layers
  plain.embedding, plain.encoder, plain.encoder_norm = (shared.embedding, shared.encoder,
                                                        shared.encoder_norm)
  plain.decoder_norm = shared.decoder_norm
  for name in SHARED:
    nnx.update(getattr(dec, DECODER_OWN[name]), nnx.state(getattr(enc, name)))
  nnx.update(dec.cross_attention, nnx.state(own.cross_attention))
  nnx.update(dec.pre_cross_attention_norm, nnx.state(own.pre_cross_attention_norm))
  return shared, plain


def _loss(model, batch):
  logits = model(batch)
  logp = jax.nn.log_softmax(logits.astype(jnp.float64 if jax.config.x64_enabled else jnp.float32))
  return -jnp.take_along_axis(logp, batch["decoder_target_tokens"][..., None], -1).mean()


def test_parameter_count_is_exact_and_the_checkpoint_holds_one_copy():
  cfg = tiny_cfg("redllm", shared_encoder_decoder=True)
  plain = tiny_cfg("redllm")
  d, layers = cfg.d_model, cfg.num_decoder_layers
  saved = layers * (param_count.attention_params(cfg) + param_count.mlp_params(cfg) + 2 * d)
  assert param_count.analytic_param_count(cfg) == param_count.analytic_param_count(plain) - saved
  assert param_count.built_param_count(cfg) == param_count.analytic_param_count(cfg)
  state = nnx.state(param_count.abstract_model(cfg), nnx.Param)
  paths = {"/".join(str(k.key) for k in p) for p, _ in jax.tree_util.tree_flatten_with_path(
      nnx.to_pure_dict(state))[0]}
  decoder = {p for p in paths if p.startswith("decoder/")}
  assert decoder and all(p.startswith(("decoder/layers/cross_attention",
                                       "decoder/layers/pre_cross_attention_norm")) for p in decoder)
  # Same computation: the FLOPs of a training step do not change.
  assert flops.train_flops(cfg, 4, 16, 32) == flops.train_flops(plain, 4, 16, 32)


@pytest.mark.parametrize("scan", [True, False])
def test_decoder_reads_the_encoder_arrays(scan):
  shared, plain = _models(scan)
  batch = _batch()
  np.testing.assert_allclose(shared(batch), plain(batch), rtol=1e-5, atol=1e-5)
  # Changing an encoder array changes the decoder too (no hidden copy).
  enc_attn = shared.encoder.layers.attention
  before = shared.decode(shared.encode(batch), batch)
  nnx.update(enc_attn, jax.tree.map(lambda a: a * 1.5, nnx.state(enc_attn, nnx.Param)))
  assert not np.allclose(shared(batch), before)


def test_gradients_of_both_uses_accumulate():
  shared, plain = _models()
  batch = _batch()
  g_shared = nnx.grad(_loss)(shared, batch)
  g_plain = nnx.grad(_loss)(plain, batch)
  for name in SHARED:
    got = jax.tree.leaves(getattr(g_shared.encoder.layers, name))
    enc = jax.tree.leaves(getattr(g_plain.encoder.layers, name))
    dec = jax.tree.leaves(getattr(g_plain.decoder.layers, DECODER_OWN[name]))
    assert len(got) == len(enc) == len(dec) > 0
    for g, e, d in zip(got, enc, dec):
      assert float(jnp.abs(d).max()) > 0 and float(jnp.abs(e).max()) > 0
      np.testing.assert_allclose(g, e + d, rtol=1e-4, atol=1e-6)


def test_config_refuses_unequal_stacks_and_decllm():
  with pytest.raises(ConfigError, match="num_encoder_layers .*equal"):
    tiny_cfg("redllm", shared_encoder_decoder=True, num_decoder_layers=1)
  with pytest.raises(ConfigError, match="RedLLM option"):
    tiny_cfg("decllm", shared_encoder_decoder=True)
