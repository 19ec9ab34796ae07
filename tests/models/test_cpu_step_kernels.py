"""The CPU kernels generation uses behind the ``cpu_kernels`` backend: greedy argmax (against
jnp.argmax's exact result on any CPU), and the few-row attention core in every decode step (the
cached-logits tests check its values end to end).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import tiny_model
from t5like.inference import generation as gen
from t5like.inference import steps
from t5like.inference.sampling import SamplingConfig, sample
from t5like.kernels import argmax as cpu_argmax
from t5like.kernels import library
from t5like.ops.cpu_kernels import CpuKernels
from t5like.ops.xla_cpu import XlaCpu

pytestmark = pytest.mark.backends("cpu")  # XLA:CPU kernels (conftest.py).



def _calls(fn, *args, name: str) -> int:
  return jax.jit(fn).lower(*args).as_text().count(name)


def test_argmax_kernel_is_jnp_argmax(kernels):
  """First maximum on ties, the first NaN where a row has one, rows of -inf, any width."""
  rng = np.random.default_rng(0)
  for shape in [(8, 8192), (3, 97), (2, 5), (1, 8)]:
    x = rng.standard_normal(shape).astype(np.float32)
    if shape == (3, 97):
      x[0, 90] = x[0, 3] = 9.0  # Tie: index 3, in the first vector.
      x[1, 50] = np.nan
      x[1, 96] = np.nan  # NaNs: the first one.
      x[2] = -np.inf
    if shape == (8, 8192):
      x[5, 8191] = np.inf  # In the last vector.
      x[6, 4000] = x[6, 7000] = 99.0
    assert cpu_argmax.applies(jnp.asarray(x))
    got = jax.jit(cpu_argmax.argmax)(x)
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(got, jnp.argmax(x, axis=-1))
  logits = jnp.asarray(rng.standard_normal((4, 97)), jnp.float32)
  greedy = lambda x: sample(x, None, SamplingConfig(), CpuKernels())  # noqa: E731
  assert _calls(greedy, logits, name=library.ARGMAX) == 1
  assert _calls(greedy, logits.astype(jnp.bfloat16), name=library.ARGMAX) == 1  # Upcast first.
  assert _calls(lambda x: sample(x, None, SamplingConfig(), XlaCpu()), logits,
                name=library.ARGMAX) == 0


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_generation_runs_on_the_kernels(kernels, family):
  """On the ``cpu_kernels`` backend a decode step's attention layers run on the few-row kernel
  (self-attention over the cache; RedLLM: and cross-attention) and greedy picks on the argmax
  kernel; on ``xla_cpu`` neither is called."""
  layers = 3
  sizes = {"num_layers" if family == "decllm" else "num_decoder_layers": layers}

  def calls(backend):
    model = tiny_model(family, seed=0, ops=backend, **sizes)
    prompts = [[5, 6, 7], [8, 9]]
    tokens, lens = gen._pad_inputs(prompts, family, len(prompts))
    plan = gen._Plan(family, tokens.shape[1], 2, -1, SamplingConfig())
    layout = steps.decode_layout(model)
    graphdef = nnx.graphdef(layout)
    text = jax.jit(lambda p, t, n: gen._run(graphdef, plan, p, t, n, None)).lower(
        nnx.to_pure_dict(nnx.state(layout)), tokens, lens).as_text()
    return text.count(library.CACHE_ATTENTION), text.count(library.ARGMAX)

  # Prefill and the loop's step (RedLLM: its prefill is the BOS step) call each layer's core.
  per_step = layers * (1 if family == "decllm" else 2)
  attention, argmax = calls("cpu_kernels")
  assert attention >= 2 * per_step and argmax == 2
  assert calls("xla_cpu") == (0, 0)
