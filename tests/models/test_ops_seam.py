"""The ops seam (t5like/ops): one implementation of each operation (the reference forms) plus the
fused attention cores, the core chosen once from the config and the mesh's platform
(``model.attention_impl="auto"``), models without platform code, and generation running the
model's own blocks (a changed block changes training logits and generated tokens alike).
"""
from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import tiny_cfg, tiny_model, tokens
from numerics import assert_close_to_scale
from t5like import ops
from t5like.config import ConfigError
from t5like.inference import generate
from t5like.models import blocks, decllm, redllm
from t5like.models.rotary import apply_rope
from t5like.ops import reference


def _mesh(platform: str, **device):
  return types.SimpleNamespace(devices=np.array(
      [types.SimpleNamespace(platform=platform, **device)] * 4))


@pytest.mark.parametrize("overrides, tpu, hopper, ampere", [
    ({}, "splash", "cudnn", "reference"),
    ({"dtype": "bfloat16", "decoder_attention": "prefix"}, "splash", "reference", "reference"),
    ({"dtype": "bfloat16", "decoder_attention": "prefix", "mixed_attention": "per_head"},
     "reference", "reference", "reference"),
    ({"dtype": "bfloat16", "dropout_rate": 0.05}, "reference", "reference", "reference"),
    ({"dtype": "float32"}, "splash", "reference", "reference"),
])
def test_auto_attention_follows_the_platform_and_the_config(overrides, tpu, hopper, ampere):
  """``auto``: splash on TPU for every mask it serves, cuDNN on Hopper+ GPUs in bf16/fp16 where
  mask and dropout allow, the reference core otherwise (CPU here), each with its reason."""
  cfg = tiny_cfg("decllm", **{"dtype": "bfloat16", **overrides})
  assert cfg.attention_impl == "auto"
  assert ops.choose_attention(cfg)[0] == "reference"  # This CPU.
  assert ops.choose_attention(cfg, _mesh("tpu"))[0] == tpu
  assert ops.choose_attention(cfg, _mesh("gpu", compute_capability="9.0"))[0] == hopper
  core, reason = ops.choose_attention(cfg, _mesh("gpu", compute_capability="8.0"))
  assert core == ampere and "Hopper" in reason
  from jax._src.mesh import AbstractDevice
  topology = jax.sharding.AbstractMesh((4,), ("data",), abstract_device=AbstractDevice(
      "TPU v5p", 1, "tpu"))
  assert ops.choose_attention(cfg, topology)[0] == tpu  # An AOT compile decides as the slice.
  resolved = ops.resolve(cfg, _mesh("tpu"))
  assert resolved.attention_impl == tpu and ops.resolve(resolved) is resolved


def test_the_model_is_built_with_the_platforms_core():
  assert tiny_model("decllm").cfg.attention_impl == "reference"  # CPU.
  assert tiny_model("redllm", attention_impl="splash").cfg.attention_impl == "splash"


@pytest.mark.parametrize("impl, overrides, named", [
    ("splash", {"dropout_rate": 0.1}, "dropout"),
    ("splash", {"decoder_attention": "prefix", "mixed_attention": "per_head"}, "mixed"),
    ("cudnn", {"dtype": "bfloat16", "decoder_attention": "prefix"}, "prefix"),
    ("cudnn", {"dtype": "float32"}, "float32"),
])
def test_an_explicit_core_that_cannot_serve_the_config_is_an_error(impl, overrides, named):
  with pytest.raises(ConfigError, match=named):
    tiny_cfg("decllm", attention_impl=impl, **overrides)


@pytest.mark.parametrize("use_table", [False, True])
def test_rope_equals_the_complex_rotation(use_table):
  """Feature pairs (i, i + d/2) as complex numbers turned by ``position * wavelength^(-2i/d)``,
  in float64 numpy; from integer positions or from their ``rotary_table``."""
  x = np.random.RandomState(0).randn(2, 7, 3, 8).astype(np.float32)
  pos = np.random.RandomState(1).randint(0, 300, size=(2, 7)).astype(np.int32)
  rot = reference.Reference().rotary_table(jnp.asarray(pos), 8, 1e4) if use_table else (
      jnp.asarray(pos))
  got = jax.jit(lambda a, r: apply_rope(a, r, 1e4))(jnp.asarray(x), rot)
  freq = 1e4 ** (-np.arange(4) * 2.0 / 8)  # [half]
  z = (x[..., :4] + 1j * x[..., 4:]) * np.exp(1j * pos[:, :, None, None] * freq)
  assert_close_to_scale(got, np.concatenate([z.real, z.imag], -1), 1e-5)


def _batch(family):
  if family == "decllm":
    return {"decoder_input_tokens": tokens((2, 16))}
  return {"encoder_input_tokens": tokens((2, 16), 1), "decoder_input_tokens": tokens((2, 8), 2)}

class _Shifted:
  """Mixed into a block: adds a fixed vector to the block's output."""

  def __call__(self, x_btd, *args, **kwargs):
    x_btd, cache = super().__call__(x_btd, *args, **kwargs)
    shift = 10 * jnp.asarray(np.random.default_rng(5).standard_normal(x_btd.shape[-1]),
                             x_btd.dtype)
    return x_btd + shift, cache


def _greedy_by_full_forwards(model, prompt, new):
  out = []
  for _ in range(new):
    if model.cfg.family == "decllm":
      logits = model({"decoder_input_tokens": jnp.asarray([[0] + prompt + out])})
    else:
      logits = model({"encoder_input_tokens": jnp.asarray([prompt]),
                      "decoder_input_tokens": jnp.asarray([[0] + out])})
    out.append(int(jnp.argmax(logits[0, -1])))
  return out


@pytest.mark.parametrize("family", ["decllm", pytest.param("redllm", marks=pytest.mark.slow)])  # Budget: docs/tests.md
def test_a_changed_block_changes_training_and_generation_alike(family, monkeypatch):
  """A test-local block subclass (the decoder's block plus a constant vector): its training
  logits differ from the plain model's, and ``generate`` (KV cache) gives exactly the tokens of
  greedy full forwards of the changed model: generation runs the blocks training runs."""
  prompts, new = [[5, 6, 7, 8], [9, 10]], 4
  plain = tiny_model(family, seed=2)
  block = blocks.SelfAttentionBlock if family == "decllm" else blocks.EncoderDecoderBlock
  module = decllm if family == "decllm" else redllm
  monkeypatch.setattr(module, block.__name__, type("Shifted", (_Shifted, block), {}))
  shifted = tiny_model(family, seed=2)
  batch = _batch(family)
  assert not np.allclose(shifted(batch), plain(batch), atol=1e-3)
  got = generate(shifted, prompts, max_new_tokens=new, eos_id=-1)
  assert got == [_greedy_by_full_forwards(shifted, p, new) for p in prompts]
  assert got != generate(plain, prompts, max_new_tokens=new, eos_id=-1)


def test_models_hold_no_platform_code():
  """The seam's promise: models/ names no kernel, platform or kernel gate."""
  import pathlib
  import re
  root = pathlib.Path(ops.__file__).parent.parent / "models"
  pattern = re.compile(r"on_cpu|platform\(|default_backend|applies\(|\"(tpu|gpu|cpu)\"")
  hits = [f"{p.name}:{i}" for p in root.glob("*.py")
          for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
  assert not hits, hits
