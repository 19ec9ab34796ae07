"""The decode layout of a bf16 model holds the weights every use casts to bf16 (dense kernels,
embedding tables) in bf16, and only those: the cached logits are bit-identical to decoding from
the stored float32 weights, for both families and an MoE model (whose router computes in
float32 and must stay so)."""
from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from helpers import tiny_model
from t5like.config.moe import MoEConfig
from t5like.inference import steps
from test_cached_logits import FORCED, PROMPTS, cached_logits

MOE = MoEConfig(num_experts=4, top_k=2, expert_d_ff=16, num_shared_experts=1)
CASES = {
    "decllm": ("decllm", {}),
    "redllm_gqa": ("redllm", dict(num_kv_heads=2)),
    "decllm_moe": ("decllm", dict(num_layers=2, moe=MOE)),
}


def _dtypes(module) -> dict[str, str]:
  leaves = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(nnx.state(module)))[0]
  return {jax.tree_util.keystr(p): str(x.dtype) for p, x in leaves}


@pytest.mark.parametrize("case", list(CASES))
def test_bf16_decode_layout_holds_dense_weights_in_bf16_and_changes_no_logit(case, monkeypatch):
  family, overrides = CASES[case]
  model = tiny_model(family, seed=3, dtype="bfloat16", **overrides)
  held = _dtypes(steps.decode_layout(model))
  narrow = {p for p, d in held.items() if d == "bfloat16"}
  assert narrow and all(("['w" in p or "['table']" in p) for p in narrow), sorted(narrow)
  kept = {p for p, d in held.items() if d == "float32"}
  assert any("scale" in p for p in kept)  # The norms' scales are used in float32.
  if "moe" in overrides:
    assert any("router" in p and "kernel" in p for p in kept), sorted(kept)
  got = cached_logits(model, PROMPTS, FORCED)
  monkeypatch.setattr(steps, "COMPUTE_CAST", "no parameter has this")  # The stored weights.
  assert all(d == "float32" for d in _dtypes(steps.decode_layout(model)).values())
  want = cached_logits(model, PROMPTS, FORCED)
  np.testing.assert_array_equal(got, want)
  assert np.isfinite(got).all()
