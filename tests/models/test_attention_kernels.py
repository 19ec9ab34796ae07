"""``model.attention_impl``: the splash kernel (Pallas interpret mode on CPU) and the cudnn call
(through XLA's implementation of the same ``jax.nn.dot_product_attention`` call) equal the
``xla`` path — forward and gradients — on packed DecLLM, PrefixLM and RedLLM batches."""
from __future__ import annotations

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import tiny_cfg, tokens
from numerics import assert_close_to_scale, assert_trees_close_to_scale
from t5like.config import Config, ConfigError
from t5like.models import build_model, masks
from t5like.ops import fused_attention as attention_kernels
from t5like.ops.reference import dot_product_attention

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _packed_decllm():
  seg = jnp.array([[1] * 50 + [2] * 60 + [3] * 10 + [0] * 8, [1] * 128])
  pos = jnp.concatenate([jnp.arange(50), jnp.arange(60), jnp.arange(10), jnp.zeros(8, int)])
  prefix = jnp.array([[1] * 20 + [0] * 30 + [1] * 35 + [0] * 25 + [1] * 4 + [0] * 14,
                      [1] * 70 + [0] * 58])
  return {"decoder_input_tokens": tokens((2, 128), 1) * (seg > 0),
          "decoder_segment_ids": seg,
          "decoder_positions": jnp.stack([pos, jnp.arange(128)]).astype(jnp.int32),
          "decoder_causal_attention": prefix}


def _packed_redllm():
  eseg = jnp.array([[1] * 40 + [2] * 70 + [0] * 18, [1] * 100 + [0] * 28])
  dseg = jnp.array([[1] * 30 + [2] * 20 + [0] * 14, [1] * 64])
  epos = jnp.stack([jnp.concatenate([jnp.arange(40), jnp.arange(70), jnp.zeros(18, int)]),
                    jnp.concatenate([jnp.arange(100), jnp.zeros(28, int)])])
  dpos = jnp.stack([jnp.concatenate([40 + jnp.arange(30), 70 + jnp.arange(20),  # Continuous.
                                     jnp.zeros(14, int)]), 100 + jnp.arange(64)])
  return {"encoder_input_tokens": tokens((2, 128), 2) * (eseg > 0),
          "encoder_segment_ids": eseg, "encoder_positions": epos.astype(jnp.int32),
          "decoder_input_tokens": tokens((2, 64), 3) * (dseg > 0),
          "decoder_segment_ids": dseg, "decoder_positions": dpos.astype(jnp.int32)}


CASES = [
    # Plain causal DecLLM: the GQA case below is causal too; ``-m slow`` (make test's budget).
    pytest.param("decllm", dict(), _packed_decllm, marks=pytest.mark.slow),
    ("decllm", dict(decoder_attention="prefix"), _packed_decllm),
    ("decllm", dict(num_kv_heads=2), _packed_decllm),
    ("redllm", dict(), _packed_redllm),
    # The mixed masks through the whole model (the kernel's mixed masks alone are checked in the
    # default suite by test_splash_kernel_matches_the_materialised_mask): ``-m slow``.
    pytest.param("redllm", dict(mixed_attention="per_head", attn_out_norm_scope="all_heads"),
                 _packed_redllm, marks=pytest.mark.slow),
    pytest.param("redllm", dict(mixed_attention="per_layer", num_kv_heads=1), _packed_redllm,
                 marks=pytest.mark.slow),
]


def _loss_and_grads(family, overrides, batch, impl):
  model = build_model(tiny_cfg(family, attention_impl=impl, **overrides), nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  weights = batch.get("decoder_segment_ids", jnp.ones_like(batch["decoder_input_tokens"])) > 0

  @jax.jit
  def loss(p):
    logits = nnx.merge(graphdef, p)(batch)
    return jnp.sum(jax.nn.log_softmax(logits)[..., 5] * weights), logits

  (value, logits), grads = jax.value_and_grad(loss, has_aux=True)(params)
  return logits, grads


@pytest.mark.backends("cpu", "tpu")  # Splash: interpret mode on CPU, a TPU kernel.
@pytest.mark.parametrize("family, overrides, make_batch", CASES,
                         ids=["causal", "prefix", "gqa", "redllm", "mixed_head", "mixed_layer"])
def test_splash_equals_the_reference_forward_and_gradients(family, overrides, make_batch):
  batch = make_batch()
  logits_x, grads_x = _loss_and_grads(family, overrides, batch, "reference")
  logits_s, grads_s = _loss_and_grads(family, overrides, batch, "splash")
  real = np.asarray(batch["decoder_segment_ids"]) > 0
  assert_close_to_scale(np.asarray(logits_s)[real], np.asarray(logits_x)[real])
  assert_trees_close_to_scale(grads_s, grads_x)


@pytest.mark.backends("cpu", "tpu")  # Splash: interpret mode on CPU, a TPU kernel.
@pytest.mark.parametrize("kind, mixed", [("causal", "none"), ("bidirectional", "none"),
                                         ("cross", "none"), ("prefix", "none"),
                                         ("bidirectional", "per_head"),
                                         ("bidirectional", "per_layer")])
def test_splash_kernel_matches_the_materialised_mask(kind, mixed):
  r = jax.random.split(jax.random.key(0), 3)
  b, t, s = 2, 96, (160 if kind == "cross" else 96)  # Not lane multiples: padded inside.
  q = jax.random.normal(r[0], (b, t, 4, 16))
  k, v = jax.random.normal(r[1], (b, s, 2, 16)), jax.random.normal(r[2], (b, s, 2, 16))
  qseg = jnp.array([[1] * 40 + [2] * 50 + [0] * 6, [1] * 96])
  kvseg = qseg if kind != "cross" else jnp.array([[1] * 70 + [2] * 80 + [0] * 10, [1] * 160])
  prefix = jnp.array([[1] * 10 + [0] * 30 + [1] * 25 + [0] * 31, [1] * 48 + [0] * 48])
  for backward in ((False, True) if mixed == "per_layer" else (False,)):
    spec = masks.MaskSpec(qseg, kvseg, kind, prefix if kind == "prefix" else None, mixed, 4,
                          backward)
    mask = masks.materialize(spec)
    out = attention_kernels.splash_attention(q, k, v, spec)
    ref = dot_product_attention(q, k, v, mask)
    assert_close_to_scale(out, ref)
    assert float(jnp.abs(out[0, -6:]).max()) == 0.0  # Padding queries give zeros, as the reference.


@pytest.mark.backends("cpu", "tpu")  # Splash: interpret mode on CPU, a TPU kernel.
def test_the_prefix_trick_sees_later_keys_only_inside_the_prefix():
  """A later key reaches a query exactly when both are in the same segment's prefix."""
  q = jnp.zeros((1, 128, 1, 8))
  k = jnp.zeros((1, 128, 1, 8))
  seg = jnp.array([[1] * 64 + [2] * 64])
  prefix = jnp.array([[1] * 16 + [0] * 48 + [1] * 8 + [0] * 56])
  spec = masks.MaskSpec(seg, seg, "prefix", prefix)
  for j in (3, 15, 16, 40, 66, 71, 72, 100):  # One-hot value on key j.
    v = jnp.zeros((1, 128, 1, 8)).at[0, j, 0, 0].set(1.0)
    seen = np.asarray(attention_kernels.splash_attention(q, k, v, spec))[0, :, 0, 0] > 0
    expected = np.asarray(masks.materialize(spec))[0, 0, :, j]
    np.testing.assert_array_equal(seen, expected, err_msg=f"key {j}")


def test_splash_is_refused_on_a_gpu_with_the_alternatives(monkeypatch):
  """Decided by the platform traced for (`fused_attention.platform`: the mesh's devices, else
  the default backend), so that a TPU mesh compiled ahead of time on a CPU host is not refused
  (`make test-aot` compiles one)."""
  seg = jnp.ones((1, 8), jnp.int32)
  q = jnp.zeros((1, 8, 1, 8))
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert attention_kernels.platform() == "gpu"
  with pytest.raises(ValueError, match="TPU kernel.*on 'gpu'.*'cudnn'"):
    attention_kernels.splash_attention(q, q, q, masks.MaskSpec(seg, seg, "causal"))


@pytest.mark.parametrize("kind", ["causal", "bidirectional", "cross"])
def test_cudnn_call_translates_the_mask_to_lengths(kind):
  """The same jax.nn.dot_product_attention call, run by XLA here (the GPU runs cuDNN's)."""
  r = jax.random.split(jax.random.key(1), 3)
  q = jax.random.normal(r[0], (2, 12, 4, 8))
  k, v = jax.random.normal(r[1], (2, 12, 2, 8)), jax.random.normal(r[2], (2, 12, 2, 8))
  seg = jnp.array([[1] * 9 + [0] * 3, [1] * 12])
  spec = masks.MaskSpec(seg, seg, kind)
  out = attention_kernels.cudnn_attention(q, k, v, spec, implementation="xla")
  assert_close_to_scale(out, dot_product_attention(q, k, v, masks.materialize(spec)))


@pytest.mark.parametrize("overrides, message", [
    (dict(attention_impl="flash"), "valid|one of"),
    (dict(attention_impl="splash", dropout_rate=0.1), "dropout"),
    (dict(attention_impl="splash", decoder_attention="prefix", mixed_attention="per_head"),
     "mixed forward/backward PrefixLM"),
    (dict(attention_impl="cudnn", decoder_attention="prefix"), "causal and full"),
    (dict(attention_impl="cudnn", dtype="float32"), "needs model.dtype='bfloat16'"),
    (dict(attention_impl="cudnn", dtype="bfloat16", head_dim=12), "multiple of 8"),
])
def test_unsupported_kernel_settings_are_config_errors(overrides, message):
  with pytest.raises(ConfigError, match=message):
    tiny_cfg("decllm", **overrides)


def test_cudnn_with_packing_takes_the_packed_layout():
  """Packed data with cuDNN validates (cuDNN's packed layout, tests/models/test_cudnn_packed.py);
  unpacked data takes the plain call (one slot per row)."""
  cfg = Config()
  cfg.model.attention_impl = "cudnn"
  assert cfg.validate().model.max_segments_per_row == 0
  cfg.data.pack = False
  assert cfg.validate().model.max_segments_per_row == 1


MESH_SCRIPT = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
sys.path.insert(0, "tests/models")
sys.path.insert(0, "tests")
from test_attention_kernels import _packed_decllm, _packed_redllm
from helpers import tiny_cfg
from t5like import partitioning
from t5like.config.train import MeshConfig
from t5like.models import build_model
assert jax.device_count() == 8
out = {}
for family, kw, make in (("decllm", dict(decoder_attention="prefix"), _packed_decllm),
                         ("redllm", dict(mixed_attention="per_head", num_kv_heads=2),
                          _packed_redllm)):
  batch = make()
  batch = {k: jnp.concatenate([v] * 4) for k, v in batch.items()}  # 8 rows over 4 shards.
  res = {}
  for impl in ("reference", "splash"):
    model = build_model(tiny_cfg(family, attention_impl=impl, **kw), nnx.Rngs(0))
    mesh = partitioning.make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    with jax.set_mesh(mesh), partitioning.axis_rules():
      logits = nnx.jit(lambda m, b: m(b))(model, batch)
    res[impl] = np.asarray(logits).tolist()
  out[family] = res
print("RESULT" + json.dumps(out))
"""


def test_splash_on_a_mesh_of_8_devices_equals_the_reference():
  sys.path.insert(0, os.path.join(REPO, "tests", "training"))
  from train_helpers import run_script
  result = json.loads(run_script(MESH_SCRIPT, devices=8).stdout.split("RESULT", 1)[1])
  for family, res in result.items():
    xla, splash = np.asarray(res["reference"]), np.asarray(res["splash"])
    real = np.abs(xla).sum(-1) > 0
    assert_close_to_scale(splash[real], xla[real], err_msg=family)
