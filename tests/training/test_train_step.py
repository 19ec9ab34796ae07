"""The jitted train step on one device: microbatch accumulation, the non-finite guard, dropout."""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5like import partitioning
from t5like.training import loop, state as state_lib, step as step_lib
from t5like.training.data import SyntheticData, global_batch
from numerics import assert_close_to_scale, assert_trees_close_to_scale
from train_helpers import tiny_config


def _setup(cfg):
  mesh = partitioning.make_mesh(cfg.mesh)
  setup = state_lib.build_setup(cfg, mesh)
  it = SyntheticData(cfg).train(cfg.train.batch_size, 0, 1)
  batch = global_batch(next(it), setup.batch_sharding, cfg.train.batch_size)
  return setup, batch


def _np(tree):
  return jax.tree.map(np.asarray, jax.device_get(tree))


def test_microbatch_accumulation_matches_the_full_batch():
  # RedLLM: both stacks and every feature go through the microbatch split (the split itself is
  # family-agnostic: a strided reshape of every [batch, ...] feature).
  results = []
  for micro in (1, 4):
    cfg = tiny_config("redllm")
    cfg.train.microbatches = micro
    cfg.train.warmup_steps = 0  # A non-zero learning rate at step 0.
    setup, batch = _setup(cfg)
    state = state_lib.init_state(setup)
    new_state, metrics = step_lib.make_train_step(setup)(state, batch)
    results.append((_np(new_state.params), _np(metrics)))
  (p1, m1), (p4, m4) = results
  # Summed in another order (4 partial sums): equal to the scale of each quantity; see numerics.
  for k in ("loss", "cross_entropy", "z_loss", "accuracy", "grad_norm", "target_tokens"):
    assert_close_to_scale(m4[k], m1[k], err_msg=k)
  assert_trees_close_to_scale(p4, p1)
  changed = jax.tree.leaves(jax.tree.map(lambda a, b: not np.array_equal(a, b), p1,
                                         _np(state_lib.init_state(setup).params)))
  assert any(changed)


def test_non_finite_step_is_skipped_and_counted():
  cfg = tiny_config("decllm")
  cfg.train.warmup_steps = 0
  setup, batch = _setup(cfg)
  train_step = step_lib.make_train_step(setup)
  state = state_lib.init_state(setup)
  bad_params = jax.tree.map(lambda x: x, state.params)
  bad_params["embedding"]["table"] = bad_params["embedding"]["table"].at[:].set(jnp.nan)
  bad = state.replace(params=bad_params)
  before = _np(bad)
  after, metrics = train_step(bad, batch)
  after = _np(after)
  assert float(metrics["finite"]) == 0.0
  assert int(after.step) == 1 and int(after.skipped_steps) == 1
  assert int(after.consecutive_skipped) == 1
  # Nothing applied: parameters (NaNs included) and optimizer state are the old ones.
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), before.params, after.params)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), before.opt_state,
               after.opt_state)
  # A finite step resets the consecutive counter but keeps the total.
  good = state_lib.init_state(setup).replace(skipped_steps=jnp.int32(3),
                                             consecutive_skipped=jnp.int32(2))
  good, metrics = train_step(good, batch)
  assert float(metrics["finite"]) == 1.0
  assert int(good.consecutive_skipped) == 0 and int(good.skipped_steps) == 3


def test_dropout_is_deterministic_per_step():
  cfg = tiny_config("decllm")
  cfg.model.dropout_rate = 0.1
  setup, batch = _setup(cfg)
  train_step = step_lib.make_train_step(setup)
  losses = []
  for _ in range(2):
    state = state_lib.init_state(setup)
    state, m0 = train_step(state, batch)
    _, m1 = train_step(state, batch)
    losses.append((float(m0["loss"]), float(m1["loss"])))
  assert losses[0] == losses[1]
  eval_loss = step_lib.make_eval_step(setup)(state_lib.init_state(setup).params, batch)
  assert float(eval_loss["cross_entropy"]) / float(eval_loss["weight"]) != losses[0][0]


def test_consecutive_non_finite_steps_stop_the_run_without_checkpointing(tmp_path,
                                                                        monkeypatch):
  cfg = tiny_config("decllm", steps=20)
  cfg.train.max_nonfinite_steps = 3
  cfg.checkpoint.every = 2
  real_init = state_lib.init_state

  def poisoned(setup):
    state = real_init(setup)
    params = dict(state.params)
    params["final_norm"] = {"scale": state.params["final_norm"]["scale"] * jnp.inf}
    return state.replace(params=params)
  monkeypatch.setattr(state_lib, "init_state", poisoned)
  with pytest.raises(loop.NonFiniteError, match="3 consecutive steps"):
    loop.run(cfg, str(tmp_path), data=SyntheticData(cfg))
  ckpts = tmp_path / "checkpoints"
  assert not [d for d in os.listdir(ckpts) if d.isdigit()]
