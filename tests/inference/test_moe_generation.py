"""Generation with MoE feed-forwards: at every decode step the cached logits equal a full forward
(dropless routing is per token, so one token per row at a step routes as in the full pass), for
DecLLM with a dense prefix layer (a mixed stack) and RedLLM with MoE in every other encoder layer,
through the unstacked decoder ``generate`` runs and through the model's own stack."""
from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from helpers import tiny_model
from numerics import assert_close_to_scale
from t5like.config.moe import MoEConfig
from t5like.models import moe
from test_cached_logits import FORCED, PROMPTS, cached_logits, full_logits

CASES = {
    "decllm_dense_then_moe": ("decllm", dict(num_layers=3), dict(decoder_first_dense=1)),
    "redllm_moe_every_other_encoder": ("redllm", dict(num_encoder_layers=2),
                                       dict(encoder_layers="every_other", num_groups=2)),
}


@pytest.mark.parametrize("layout", ["generate", "stack"])
@pytest.mark.parametrize("case", list(CASES))
def test_moe_cached_logits_equal_full_forward(case, layout):
  family, overrides, moe_overrides = CASES[case]
  cfg = MoEConfig(num_experts=4, top_k=2, expert_d_ff=16, num_shared_experts=1, **moe_overrides)
  model = tiny_model(family, seed=1, moe=cfg, **overrides)
  biases = nnx.state(model, moe.RouterBias)  # Non-zero: a bias that changes the routing.
  nnx.update(model, jax.tree.map(lambda b: b + np.linspace(-0.2, 0.2, b.shape[-1]), biases))
  got = cached_logits(model, PROMPTS, FORCED, unstacked=layout == "generate")
  want = full_logits(model, PROMPTS, FORCED)
  for i in range(len(PROMPTS)):
    for t in range(FORCED.shape[1]):
      assert_close_to_scale(got[i, t], want[i, t], err_msg=f"{case} row {i} step {t}")
