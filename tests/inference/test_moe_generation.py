"""Generation with MoE feed-forwards: at every decode step the cached logits equal a full forward
(dropless routing is per token, so one token per row at a step routes as in the full pass), for
DecLLM with a dense prefix layer (a mixed stack) and RedLLM with MoE in every other encoder layer,
through the unstacked decoder ``generate`` runs and through the model's own stack."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import tiny_model
from numerics import assert_close_to_scale
from t5like.config.moe import MoEConfig
from t5like.evaluation.scoring import option_loglikelihoods
from t5like.inference import generation as gen
from t5like.inference.generation import generate
from t5like.inference.sampling import SamplingConfig
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


ROWS = [[5 + i, 9 + 2 * i, 30 + 3 * i][: 1 + i % 3] + [60 + i] * (i % 4) for i in range(8)]
FAMILIES = {"decllm": dict(num_layers=2), "redllm": dict(num_encoder_layers=1)}


def _capacity_and_dropless(family):
  """The same weights routed at capacity factor 1.25 and dropless; the router and experts scaled
  up so that the experts decide the greedy tokens (at init the residual stream does)."""
  moe_cfg = MoEConfig(num_experts=4, top_k=2, expert_d_ff=16, num_shared_experts=0,
                      capacity_factor=1.25)
  capped = tiny_model(family, seed=3, moe=moe_cfg, **FAMILIES[family])
  for path, v in nnx.to_flat_state(nnx.state(capped, nnx.Param)):
    if "experts" in path or "router" in path:
      v.set_value(v.get_value() * 3.0)
  free = tiny_model(family, seed=3, moe=dataclasses.replace(moe_cfg, capacity_factor=0.0),
                    **FAMILIES[family])
  nnx.update(free, nnx.state(capped))
  return capped, free


@pytest.mark.parametrize("family", list(FAMILIES))
def test_capacity_model_generates_and_scores_as_dropless(family):
  """A capacity-routed model (the path expert parallelism trains on) generates and scores as the
  same weights routed dropless: at a decode step the capacity would be counted over that step's
  8 tokens and drop some of them (greedy rows then differ: 3 of 8 in both families)."""
  capped, free = _capacity_and_dropless(family)
  want = generate(free, ROWS, max_new_tokens=8, eos_id=-1)
  assert len({tuple(r) for r in want}) == len(ROWS)  # Tokens the experts chose, not a copy.
  assert generate(capped, ROWS, max_new_tokens=8, eos_id=-1) == want
  pairs = [(r, [7, 8, 9]) for r in ROWS]
  np.testing.assert_allclose(option_loglikelihoods(capped, pairs, batch_size=8),
                             option_loglikelihoods(free, pairs, batch_size=8), rtol=1e-6)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_finished_rows_are_not_counted(family):
  """A decode step given the rows still generating counts only their tokens (MoE loads)."""
  model = tiny_model(family, seed=1, moe=MoEConfig(num_experts=4, top_k=2, expert_d_ff=16),
                     **FAMILIES[family])
  tokens, lens = gen._pad_inputs(ROWS, family, len(ROWS))
  plan = gen._Plan(family, tokens.shape[1], 3, -1, SamplingConfig())
  live = np.arange(len(ROWS)) % 3 != 0

  @nnx.jit
  def loads(mdl):
    _, state, step = gen._prefill(mdl, plan, jnp.asarray(tokens), jnp.asarray(lens))
    moe.pop_layer_stats(mdl)  # The prefill's.
    with moe.collect_stats():
      step(jnp.full((len(ROWS),), 7), 1, state, jnp.asarray(live))
    return {k: s.tokens for k, s in moe.pop_layer_stats(mdl).items()}

  stacks = loads(model)
  assert stacks and all(np.all(np.asarray(t) == live.sum()) for t in stacks.values())
