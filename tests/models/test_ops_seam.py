"""The ops seam (t5like/ops): every backend computes what the reference forms compute, forward and
backward; a model on the reference backend gives the chosen backend's logits and gradients; the
backend is chosen once, from the config and the platform; and generation runs the model's own
blocks (a changed block changes training logits and generated tokens alike).
"""
from __future__ import annotations

import types

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import tiny_model, tokens
from numerics import assert_close_to_scale, assert_trees_close_to_scale
from t5like import ops
from t5like.inference import generate
from t5like.kernels import library
from t5like.models import blocks, decllm, masks, redllm
from t5like.ops import reference

BACKENDS = [b for b in ops.BACKENDS if b != "reference"]
RNG = np.random.default_rng(0)


def _normal(*shape, dtype=jnp.float32):
  return jnp.asarray(RNG.standard_normal(shape), dtype)


def _backend(name):
  return ops._backend(name, "xla", 0)


def _check_op(name, fn, args, rel=1e-4, grad=True):
  """``fn(backend, *args)`` of backend ``name`` equals the reference's, and so do the gradients
  of a random projection of its output with respect to every float argument."""
  ref = fn(_backend("reference"), *args)
  got = jax.jit(lambda *a: fn(_backend(name), *a))(*args)
  assert_close_to_scale(got, ref, rel)
  if not grad:
    return
  floats = [i for i, a in enumerate(args) if hasattr(a, "dtype")
            and jnp.issubdtype(a.dtype, jnp.floating)]
  cot = _normal(*ref.shape)

  def loss(backend, *xs):
    full = list(args)
    for i, x in zip(floats, xs):
      full[i] = x
    return jnp.sum(fn(backend, *full).astype(jnp.float32) * cot)

  xs = [args[i] for i in floats]
  want = jax.grad(lambda *x: loss(_backend("reference"), *x), range(len(xs)))(*xs)
  have = jax.jit(jax.grad(lambda *x: loss(_backend(name), *x), range(len(xs))))(*xs)
  assert_trees_close_to_scale(have, want, rel)


def _masks(b, h, t, s):
  """Bool masks [b, h|1, t, s]: causal over padded rows, a prefix, per head, and cross."""
  seg = (np.arange(t)[None, :] >= np.array([0, 3])[:b, None]).astype(np.int32)
  causal = masks.self_attention_mask(jnp.asarray(seg), kind="causal")
  prefix = masks.self_attention_mask(jnp.asarray(seg), kind="prefix",
                                     prefix_bt=jnp.asarray(np.arange(t) < 5)[None].repeat(b, 0),
                                     mixed="per_head", num_heads=h)
  cross = masks.cross_attention_mask(jnp.asarray(seg), jnp.asarray(seg[:, :s]))
  return {"causal": causal, "prefix_per_head": prefix, "cross": cross}


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("n, x_shape, w_shape", [(1, (3, 5, 16), (16, 4, 8)),
                                                 (2, (3, 5, 4, 8), (4, 8, 16))])
@pytest.mark.parametrize("dtype, rel", [(jnp.float32, 1e-4), (jnp.bfloat16, 2e-2)])
def test_dense_equals_the_reference(name, n, x_shape, w_shape, dtype, rel):
  _check_op(name, lambda o, x, w: o.dense(x, w, n),
            (_normal(*x_shape, dtype=dtype), _normal(*w_shape, dtype=dtype)), rel)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("dtype, rel", [(jnp.float32, 1e-4), (jnp.bfloat16, 2e-2)])
def test_logits_equal_the_reference(name, dtype, rel):
  _check_op(name, lambda o, x, t: o.logits(x, t),
            (_normal(3, 5, 16, dtype=dtype), _normal(40, 16, dtype=dtype)), rel)


def _products(jaxpr):
  """Every dot_general of a jaxpr and its sub-jaxprs: (operand dtypes, output dtype)."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      yield tuple(v.aval.dtype for v in eqn.invars), eqn.outvars[0].aval.dtype
    for p in eqn.params.values():
      for sub in (p if isinstance(p, (tuple, list)) else (p,)):
        if isinstance(sub, (jax.extend.core.Jaxpr, jax.extend.core.ClosedJaxpr)):
          yield from _products(getattr(sub, "jaxpr", sub))


@pytest.mark.parametrize("name", ops.BACKENDS)
def test_bf16_dense_products_stay_bf16_in_the_backward_pass(name):
  """A bf16 step's dense gradients are products of bf16 operands: a float32 output in the
  forward pass would make them float32 products (TF32 on a GPU: half of a bf16 1B step on an
  H200). (The logits keep their float32 output and its float32 backward.)"""
  x = _normal(3, 5, 16, dtype=jnp.bfloat16)
  w = _normal(16, 8)  # A float32 parameter, as stored.
  grad = jax.grad(lambda x, w: jnp.sum(_backend(name).dense(x, w).astype(jnp.float32) ** 2),
                  (0, 1))
  found = list(_products(jax.make_jaxpr(grad)(x, w).jaxpr))
  assert len(found) >= 3, found  # Forward, and both gradients.
  assert all(dt == jnp.bfloat16 for ins, _ in found for dt in ins), found


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("scale_shape", [(16,), (4, 16)])
def test_rms_norm_equals_the_reference(name, scale_shape):
  _check_op(name, lambda o, x, s: o.rms_norm(x, s, 1e-6),
            (_normal(2, 8, 4, 16), 1.0 + 0.1 * _normal(*scale_shape)))


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("norm, rope", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("dtype, rel", [(jnp.float32, 1e-4), (jnp.bfloat16, 2e-2)])
def test_norm_rope_equals_the_reference(name, norm, rope, dtype, rel):
  rot = reference.rotation(jnp.asarray(RNG.integers(0, 50, (2, 8))), 16, 10_000.0)
  scale = 1.0 + 0.1 * _normal(16)
  fn = lambda o, x, s: o.norm_rope(x, s if norm else None, rot if rope else None,  # noqa: E731
                                   1e-6)
  _check_op(name, fn, (_normal(2, 8, 4, 16, dtype=dtype), scale), rel)


@pytest.mark.parametrize("name", BACKENDS)
def test_rotary_table_equals_the_reference(name):
  positions = jnp.asarray(RNG.integers(0, 300, (2, 9)))
  for got, want in zip(jax.jit(lambda p: _backend(name).rotary_table(p, 16, 1e4))(positions),
                       reference.rotation(positions, 16, 1e4)):
    assert_close_to_scale(got, want)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("kind", ["causal", "prefix_per_head", "cross"])
@pytest.mark.parametrize("t, kv_heads", [(8, 2), (1, 4), (13, 4)])
def test_attention_equals_the_reference(name, kind, t, kv_heads):
  """Shapes where the kernels apply (t = 8: the train core; t = 1: the few-row core) and where
  they do not (t = 13), grouped and plain heads."""
  b, h, d = 2, 4, 16
  s = 16 if kind == "cross" else t
  mask = _masks(b, h, max(t, s), s)[kind][:, :, :t, :s]
  fn = lambda o, q, k, v: o.attention(q, k, v, mask, causal=kind == "causal")  # noqa: E731
  _check_op(name, fn, (_normal(b, t, h, d), _normal(b, s, kv_heads, d),
                       _normal(b, s, kv_heads, d)))


@pytest.mark.parametrize("name", BACKENDS)
def test_causal_attention_over_many_blocks_equals_the_reference(name):
  """A causal mask long enough for the ``xla`` forms to split the queries into blocks."""
  t = 2 * 128 + 40
  mask = _masks(2, 2, t, t)["causal"]
  fn = lambda o, q, k, v: o.attention(q, k, v, mask, causal=True)  # noqa: E731
  _check_op(name, fn, (_normal(2, t, 2, 16), _normal(2, t, 1, 16), _normal(2, t, 1, 16)))


@pytest.mark.parametrize("name", BACKENDS)
def test_argmax_equals_the_reference(name):
  logits = _normal(3, 50)
  logits = logits.at[1, 7].set(logits[1].max()).at[1, 30].set(logits[1].max())  # A tie.
  got = jax.jit(_backend(name).argmax)(logits)
  np.testing.assert_array_equal(got, reference.Reference().argmax(logits))


def test_the_choice_follows_the_config_and_the_platform(monkeypatch):
  monkeypatch.delenv(ops.ENV_OPS, raising=False)
  monkeypatch.delenv(ops.ENV_CPU_KERNELS, raising=False)
  assert ops.choose("reference") == "reference"
  want = "cpu_kernels" if library.built() else "xla_cpu"
  assert ops.choose("auto") == want
  one = jax.make_mesh((1,), ("data",))
  assert ops.choose("auto", one) == want
  several = types.SimpleNamespace(devices=np.array(jax.devices()[:1] * 2))
  assert ops.choose("auto", several) == "xla_cpu"  # An FFI call is not partitioned.
  tpu = types.SimpleNamespace(devices=np.array([types.SimpleNamespace(platform="tpu")] * 4))
  assert ops.choose("auto", tpu) == "xla"  # An ahead-of-time compile for TPUs on a CPU host.
  gpu = types.SimpleNamespace(devices=np.array([types.SimpleNamespace(platform="gpu")] * 2))
  assert ops.choose("auto", gpu) == "xla"
  monkeypatch.setenv(ops.ENV_CPU_KERNELS, "0")
  assert ops.choose("auto") == "xla_cpu"
  monkeypatch.setenv(ops.ENV_OPS, "reference")
  assert ops.choose("auto") == "reference"
  monkeypatch.setenv(ops.ENV_OPS, "fast")
  with pytest.raises(ValueError, match="model.ops='fast'"):
    ops.choose("auto")


def _batch(family):
  if family == "decllm":
    return {"decoder_input_tokens": tokens((2, 16))}
  return {"encoder_input_tokens": tokens((2, 16), 1), "decoder_input_tokens": tokens((2, 8), 2)}


def _logits_and_grads(model, batch):
  graphdef, params = nnx.split(model)

  def loss(p):
    return jnp.mean(jnp.square(nnx.merge(graphdef, p)(batch)))

  return jax.jit(lambda p: (nnx.merge(graphdef, p)(batch), jax.grad(loss)(p)))(params)


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_the_reference_backend_gives_the_same_logits_and_gradients(family, monkeypatch):
  """The model on its chosen backend (here: CPU, one device) against the same parameters on
  the reference forms; head_dim 16 and lengths of 8/16 let every kernel apply."""
  monkeypatch.delenv(ops.ENV_OPS, raising=False)
  chosen = tiny_model(family, head_dim=16, num_kv_heads=2)
  plain = tiny_model(family, head_dim=16, num_kv_heads=2, ops="reference")
  assert chosen.cfg.ops != "reference" and plain.cfg.ops == "reference"
  logits, grads = _logits_and_grads(chosen, _batch(family))
  want_logits, want_grads = _logits_and_grads(plain, _batch(family))
  assert_close_to_scale(logits, want_logits)
  assert_trees_close_to_scale(grads, want_grads)


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


@pytest.mark.parametrize("family", ["decllm", "redllm"])
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
  pattern = re.compile(r"on_cpu|platform\(|t5like\.kernels|applies\(")
  hits = [f"{p.name}:{i}" for p in root.glob("*.py")
          for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
  assert not hits, hits
