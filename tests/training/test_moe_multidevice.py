"""The MoE capacity path over 8 fake CPU devices (in a subprocess), mesh expert=4 x fsdp=2:

- the expert-parallel dispatch (all_to_all inside shard_map) equals the one-device dispatch run on
  each batch shard's rows, and its dropped pairs equal a direct count per shard;
- with room for every pair, a DecLLM and a RedLLM with MoE layers give the same logits, loads and
  train step (gradients through the updated parameters, biases through the loads) as on 1 device;
- there, dense weights are FSDP-sharded over all 8 devices, the routed experts 2 a device, and
  no device gathers the other shards' chosen experts.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from numerics import assert_close_to_scale
from train_helpers import run_script

SCRIPT = r"""
import re, sys
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from t5like import partitioning
from t5like.config import MeshConfig
from t5like.models import moe
from t5like.models.moe_dispatch import capacity_experts
from t5like.training import state as state_lib, step as step_lib
from t5like.training.data import SyntheticData, global_batch
from train_helpers import tiny_config

out = {}
assert jax.device_count() == 8
mesh8 = partitioning.make_mesh(MeshConfig(data=1, fsdp=2, tensor=1, expert=4))
mesh1 = partitioning.make_mesh(MeshConfig(data=1, fsdp=1, tensor=1, expert=1), jax.devices()[:1])

# 1. The dispatch alone: 16 rows of 6 tokens, 8 experts of which each device holds 2.
r = np.random.RandomState(0)
B, T, D, E, K, F = 16, 6, 8, 8, 2, 4
x = jnp.asarray(r.normal(size=(B, T, D)), jnp.float32)
idx = jnp.asarray(np.argsort(r.uniform(size=(B, T, E)), -1)[..., :K], jnp.int32)
valid = jnp.asarray(r.uniform(size=(B, T)) > 0.2)
w = tuple(jnp.asarray(r.normal(size=s), jnp.float32) for s in ((E, D, F), (E, D, F), (E, F, D)))
fn = jax.jit(lambda x, i, v, *w: capacity_experts(x, i, v, w, 0.75))
with jax.set_mesh(mesh8), partitioning.axis_rules():
  y8, kept8 = fn(x, idx, valid, *w)
ys, keeps = zip(*[fn(x[s:s + 2], idx[s:s + 2], valid[s:s + 2], *w) for s in range(0, B, 2)])
out.update(dispatch_y8=y8, dispatch_kept8=kept8, dispatch_y1=jnp.concatenate(ys),
           dispatch_kept1=jnp.concatenate(keeps), dispatch_idx=idx, dispatch_valid=valid)

# 2. Whole models: logits, loads and one train step, 8 devices vs 1.
def run(cfg, mesh, state=None):
  setup = state_lib.build_setup(cfg, mesh)
  if state is None:
    state = state_lib.init_state(setup)
  else:
    state = jax.device_put(state, setup.state_shardings)
  start = jax.device_get(state)
  batch = global_batch(next(SyntheticData(cfg).train(cfg.train.batch_size, 0, 1)),
                       setup.batch_sharding, cfg.train.batch_size)
  def forward(params, model_state, batch):
    model = nnx.merge(setup.graphdef, params, model_state)
    with moe.collect_stats():
      logits = model(batch)
    return logits, {"/".join(map(str, k)): v.load for k, v in moe.pop_layer_stats(model).items()}
  with jax.set_mesh(mesh), partitioning.axis_rules():
    logits, loads = jax.jit(forward)(state.params, state.model_state, batch)
  train_step = step_lib.make_train_step(setup).lower(state, batch).compile()
  if mesh is mesh8:  # All-gathers of int32 [..., top_k] arrays: the chosen experts.
    out[f"gathered_routes_{cfg.model.family}"] = np.array(re.findall(
        rf"= s32\[[\d,]*,{cfg.model.moe.top_k}\]\S* all-gather", train_step.as_text()))
  new_state, metrics = train_step(state, batch)
  for path, x in jax.tree_util.tree_flatten_with_path(new_state.params)[0]:
    name = jax.tree_util.keystr(path)
    if mesh is mesh8 and name.endswith(("['attention']['wq']", "['experts']['wi_gate']")):
      out[f"shard_{cfg.model.family}_{name.split('[')[-1][1:-2]}"] = np.array(
          [x.shape, x.sharding.shard_shape(x.shape)])
  return start, jax.device_get((logits, loads, new_state.params, new_state.model_state,
                                metrics["loss"]))

for family in ("decllm", "redllm"):
  cfg = tiny_config(family)
  cfg.train.warmup_steps = 0
  m = cfg.model.moe
  m.num_experts, m.top_k, m.expert_d_ff, m.num_shared_experts = 8, 2, 16, 1
  m.capacity_factor = 8.0  # = num_experts: C = T * K per shard, nothing can drop.
  cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor, cfg.mesh.expert = 1, 2, 1, 4
  start, res8 = run(cfg.validate(), mesh8)
  cfg.mesh.fsdp, cfg.mesh.expert = 1, 1
  _, res1 = run(cfg.validate(), mesh1, start)
  for name, a, b in zip(("logits", "loads", "params", "biases", "loss"), res8, res1):
    for i, (u, v) in enumerate(zip(jax.tree.leaves(a), jax.tree.leaves(b))):
      out[f"{family}_{name}_{i}_8"], out[f"{family}_{name}_{i}_1"] = u, v
np.savez(sys.argv[1], **{k: np.asarray(v) for k, v in out.items()})
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("moe8") / "out.npz")
  run_script(SCRIPT.replace("sys.argv[1]", repr(path)), devices=8, timeout=600)
  return dict(np.load(path))


def test_expert_parallel_dispatch_equals_per_shard_dispatch_and_direct_drop_count(results):
  r = results
  np.testing.assert_array_equal(r["dispatch_kept8"], r["dispatch_kept1"])
  np.testing.assert_allclose(r["dispatch_y8"], r["dispatch_y1"], atol=1e-5)
  idx, valid, kept = r["dispatch_idx"], r["dispatch_valid"], r["dispatch_kept8"]
  e, k = 8, idx.shape[-1]
  for s in range(0, 16, 2):  # Each batch shard (2 rows, 12 tokens): its own capacity.
    cap = math.ceil(0.75 * 12 * k / e)
    counts = np.zeros(e, int)
    for b, t in zip(*np.nonzero(valid[s:s + 2])):
      for j in idx[s + b, t]:
        counts[j] += 1
    dropped = int(np.sum(valid[s:s + 2][..., None] & ~kept[s:s + 2]))
    assert dropped == sum(max(0, c - cap) for c in counts)
  assert np.sum(valid[..., None] & ~kept) > 0  # The capacity binds somewhere.


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_dense_weights_use_every_device_for_fsdp_the_experts_their_expert_shard(results, family):
  # [layers, embed, heads, kv]: embed over (expert, fsdp) = 8 devices, not replicated over expert.
  full, shard = results[f"shard_{family}_wq"]
  assert shard[1] * 8 == full[1] and list(shard[2:]) == list(full[2:])
  # [layers, expert, embed, mlp]: 2 of the 8 experts a device, embed over fsdp (2).
  full, shard = results[f"shard_{family}_wi_gate"]
  assert (shard[1] * 4, shard[2] * 2, shard[3]) == (full[1], full[2], full[3])


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_routing_stats_count_each_shards_tokens_where_they_are(results, family):
  # Left to propagation, the loads' one-hot gathered every shard's chosen experts to every device.
  assert results[f"gathered_routes_{family}"].size == 0, results[f"gathered_routes_{family}"]


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_eight_devices_with_expert_parallelism_equal_one(results, family):
  names = sorted({k.rsplit("_", 1)[0] for k in results if k.startswith(family)})
  assert any("_loads_" in n for n in names) and any("_biases_" in n for n in names)
  for n in names:
    a, b = results[f"{n}_8"], results[f"{n}_1"]
    if "_loads_" in n or "_biases_" in n:
      np.testing.assert_array_equal(a, b, err_msg=n)  # Counts, and gamma*sign of counts.
    else:
      assert_close_to_scale(a, b, err_msg=n)
