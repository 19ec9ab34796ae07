"""8 fake CPU devices (in a subprocess), mesh data=2 x fsdp=2 x tensor=2:

- one sharded train step equals the single-device step within fp32 tolerance (both families;
  causal self-attention in query blocks);
- parameters and optimizer state are laid out as the rule table says;
- misconfigured meshes / batches fail before compiling, with a message;
- a checkpoint written on 8 devices restores on 1 device (this process) with identical values.
"""
from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest

from t5like import partitioning
from t5like.config import Config, apply_dict
from t5like.training import checkpointing, state as state_lib
from numerics import FLOAT32_REORDER_REL, assert_close_to_scale
from train_helpers import run_script

SCRIPT = r"""
import json, os, sys
import jax, numpy as np
from t5like import partitioning
from t5like.config import ConfigError, to_dict
from t5like.training import checkpointing, loop, state as state_lib, step as step_lib
from t5like.training.data import SyntheticData, global_batch
from train_helpers import tiny_config


out_dir = sys.argv[1]
assert jax.device_count() == 8
report = {"steps": {}, "specs": {}, "shard_shapes": {}, "errors": {}}

def one_step(cfg, devices):
  mesh = partitioning.make_mesh(cfg.mesh, devices)
  setup = state_lib.build_setup(cfg, mesh)
  state = state_lib.init_state(setup)
  init_params = jax.tree.leaves(jax.device_get(state.params))  # Copied before donation.
  it = SyntheticData(cfg).train(cfg.train.batch_size, 0, 1)
  step = step_lib.make_train_step(setup)
  for _ in range(2):  # Two steps: the second uses non-trivial optimizer statistics.
    batch = global_batch(next(it), setup.batch_sharding, cfg.train.batch_size)
    state, metrics = step(state, batch)
  return init_params, state, metrics

for family in ("decllm", "redllm"):
  # Same config as the checkpointed run below, so that run reuses these compilations.
  cfg = tiny_config(family, steps=3)
  cfg.train.warmup_steps = 0
  cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor = 1, 1, 1
  init1, s1, m1 = one_step(cfg, jax.devices()[:1])
  cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor = 2, 2, 2
  init8, s8, m8 = one_step(cfg, jax.devices())
  p1 = jax.tree.leaves(jax.device_get(s1.params))
  p8 = jax.tree.leaves(jax.device_get(s8.params))
  report["steps"][family] = {
      "loss": [float(m1["loss"]), float(m8["loss"])],
      "grad_norm": [float(m1["grad_norm"]), float(m8["grad_norm"])],
      "max_param_diff": max(float(np.max(np.abs(a - b))) for a, b in zip(p1, p8)),
      "max_init_diff": max(float(np.max(np.abs(a - b))) for a, b in zip(init1, init8)),
      "max_param_diff_rel": max(float(np.max(np.abs(a - b)) / np.max(np.abs(a)))
                                for a, b in zip(p1, p8)),
      "max_param_change": max(float(np.max(np.abs(a - b))) for a, b in zip(p1, init1))}
  if family == "redllm":
    flat = jax.tree_util.tree_flatten_with_path(s8)[0]
    for path, x in flat:
      key = jax.tree_util.keystr(path)
      report["specs"][key] = str(tuple(x.sharding.spec))
      report["shard_shapes"][key] = [list(x.shape), list(x.addressable_shards[0].data.shape)]

def expect_error(name, cfg):
  try:
    loop.run(cfg, os.path.join(out_dir, "err_" + name))
  except ConfigError as e:
    report["errors"][name] = str(e)

bad = tiny_config("decllm"); bad.mesh.data, bad.mesh.fsdp, bad.mesh.tensor = 1, 3, -1
expect_error("mesh", bad)
bad = tiny_config("decllm", batch_size=6); bad.mesh.data, bad.mesh.fsdp, bad.mesh.tensor = 2, 2, 2
expect_error("batch", bad)
bad = tiny_config("decllm"); bad.mesh.data, bad.mesh.fsdp, bad.mesh.tensor = 2, 2, 2
bad.train.microbatches = 4
expect_error("microbatch", bad)

# A checkpoint written on 8 devices, for the 1-device restore in the parent.
cfg = tiny_config("redllm", steps=3)
cfg.train.warmup_steps = 0
cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor = 2, 2, 2
workdir = os.path.join(out_dir, "run8")
loop.run(cfg, workdir, data=SyntheticData(cfg))
mesh = partitioning.make_mesh(cfg.mesh)
setup = state_lib.build_setup(cfg, mesh)
ckpt = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"), cfg.checkpoint)
restored = ckpt.restore(setup.abstract_state, None)
state, step = restored.state, restored.step
ckpt.close()
leaves = jax.tree.leaves(jax.device_get(state))
np.savez(os.path.join(out_dir, "state8.npz"), *leaves)
report["ckpt_step"] = step
report["config"] = to_dict(cfg)
print("REPORT " + json.dumps(report))
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory):
  out = tmp_path_factory.mktemp("multidevice")
  proc = run_script(SCRIPT.replace("sys.argv[1]", repr(str(out))), devices=8, timeout=580)
  line = [ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")][-1]
  return json.loads(line[len("REPORT "):]), out


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_sharded_step_equals_single_device_step(report, family):
  r = report[0]["steps"][family]
  # Sharded reductions sum in another order: compare to each quantity's scale (tests/numerics.py).
  assert_close_to_scale(r["loss"][1], r["loss"][0])
  assert_close_to_scale(r["grad_norm"][1], r["grad_norm"][0])
  assert r["max_init_diff"] == 0.0  # Same initialisation, built sharded or not.
  assert r["max_param_change"] > 1e-4  # The steps did move the parameters...
  # ...identically on 1 and on 8 devices, each leaf to within 1e-4 of its own largest value.
  assert r["max_param_diff_rel"] <= FLOAT32_REORDER_REL


def test_state_is_sharded_as_the_rule_table_says(report):
  specs, shapes = report[0]["specs"], report[0]["shard_shapes"]

  def spec(suffix):
    matches = [v for k, v in specs.items() if k.endswith(suffix)]
    assert len(matches) == 1, (suffix, [k for k in specs if k.endswith(suffix)])
    return matches[0]
  # Parameters: vocab/heads/mlp -> tensor, embed -> (expert, fsdp) (expert is 1 here),
  # layers/kv replicated.
  ef = "('expert', 'fsdp')"
  assert spec(".params['embedding']['table']") == f"('tensor', {ef})"
  assert spec(".params['decoder']['layers']['mlp']['wi_gate']") == f"(None, {ef}, 'tensor')"
  assert spec(".params['decoder']['layers']['mlp']['wo']") == f"(None, 'tensor', {ef})"
  assert spec(".params['encoder']['layers']['attention']['wq']") == (
      f"(None, {ef}, 'tensor', None)")
  assert spec(".params['decoder']['layers']['cross_attention']['wo']") == (
      f"(None, 'tensor', None, {ef})")
  # Adafactor statistics of the [vocab=128, embed=32] table: v_row drops vocab, v_col embed.
  assert spec(".v_row['embedding']['table']") == f"({ef},)"
  assert spec(".v_col['embedding']['table']") == "('tensor',)"
  assert spec(".v_row['decoder']['layers']['mlp']['wi_gate']") == f"(None, {ef})"
  assert spec(".step") == "()"
  # The arrays really are split: each device holds 1/4 of the table.
  full, local = shapes[".params['embedding']['table']"]
  assert full == [128, 32] and local == [64, 16]


def test_misconfiguration_fails_before_compiling_with_advice(report):
  errors = report[0]["errors"]
  assert "mesh" in errors and "devices" in errors["mesh"]
  assert "batch" in errors and "divisible by the data shards" in errors["batch"]
  assert "microbatch" in errors and "microbatch" in errors["microbatch"]


def test_checkpoint_from_8_devices_restores_on_1(report):
  rep, out = report
  cfg = apply_dict(Config(), rep["config"])
  cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor = 1, -1, 1
  assert jax.device_count() == 1
  setup = state_lib.build_setup(cfg, partitioning.make_mesh(cfg.mesh))
  ckpt = checkpointing.Checkpointer(os.path.join(out, "run8", "checkpoints"), cfg.checkpoint)
  restored = ckpt.restore(setup.abstract_state, None)
  state, step = restored.state, restored.step
  ckpt.close()
  assert step == rep["ckpt_step"] == 3
  leaves = jax.tree.leaves(jax.device_get(state))
  saved = np.load(os.path.join(out, "state8.npz"))
  assert len(leaves) == len(saved.files)
  for i, leaf in enumerate(leaves):
    np.testing.assert_array_equal(np.asarray(leaf), saved[f"arr_{i}"])
  assert all(len(x.sharding.device_set) == 1 for x in jax.tree.leaves(state))
