"""Shapes, dtypes, logical axes and parameter counts of both families."""
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from helpers import forward, tiny_cfg, tiny_model, tokens
from t5like.config.model import PAPER_SIZES, paper_model
from t5like.models import build_model
from t5like.models.param_count import abstract_model, analytic_param_count, built_param_count


@pytest.mark.parametrize("family", ["decllm", "redllm"])
@pytest.mark.parametrize("compute", ["float32", "bfloat16"])
def test_logits_shape_and_dtypes(family, compute):
  model = tiny_model(family, dtype=compute)
  batch = {"decoder_input_tokens": tokens((2, 7)), "encoder_input_tokens": tokens((2, 5), 1)}
  logits = forward(model, batch)
  assert logits.shape == (2, 7, 97)
  assert logits.dtype == jnp.float32  # Logits and loss are always float32.
  assert bool(jnp.all(jnp.isfinite(logits)))
  params = nnx.state(model, nnx.Param)
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype("float32")}


@pytest.mark.parametrize("family", ["decllm", "redllm"])
@pytest.mark.parametrize("size", list(PAPER_SIZES))
def test_paper_configs_build_abstractly_with_analytic_count(family, size):
  cfg = paper_model(family, size)
  n = built_param_count(cfg)  # nnx.eval_shape: no parameter memory is allocated.
  assert n == analytic_param_count(cfg)
  nominal = {"150m": 150e6, "1b": 1e9, "2b": 2e9, "4b": 4e9, "8b": 8e9}[size]
  assert 0.75 * nominal < n < 1.35 * nominal, (family, size, n)


def test_abstract_model_has_no_arrays():
  model = abstract_model(paper_model("decllm", "8b"))
  leaves = jax.tree.leaves(nnx.state(model, nnx.Param))
  assert leaves and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_every_parameter_has_logical_axes(family):
  allowed = {"embed", "heads", "kv", "mlp", "vocab", "layers"}
  model = tiny_model(family)
  for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    axes = var.get_metadata()["out_sharding"]
    assert len(axes) == var.get_value().ndim and set(axes) <= allowed, (path, axes)
    if "layers" in path[0] or path[0] in ("decoder", "encoder"):
      assert axes[0] == "layers", (path, axes)


def test_grouped_kv_heads_change_shapes_and_count():
  cfg = tiny_cfg("decllm", num_heads=4, num_kv_heads=2)
  model = build_model(cfg, nnx.Rngs(0))
  assert model.decoder.layers.attention.wk.get_value().shape == (2, 32, 2, 8)
  assert built_param_count(cfg) == analytic_param_count(cfg)
  assert forward(model, {"decoder_input_tokens": tokens((1, 6))}).shape == (1, 6, 97)


@pytest.mark.parametrize("scope,shape", [("per_head", (2, 8)), ("all_heads", (2, 4, 8))])
def test_attention_output_norm_scope(scope, shape):
  model = tiny_model("redllm", attn_out_norm_scope=scope)
  assert model.encoder.layers.attention.out_norm.scale.get_value().shape == shape
  assert not hasattr(tiny_model("decllm").decoder.layers.attention, "out_norm")
