"""Multi-slice ahead-of-time compiles (``--topology ... --num_slices N``): the real train step
compiled for slices that need not exist, with the DCN traffic read from the program (the
``_xla_megascale_*`` send / recv ops) and charged to DCN bandwidth apart from ICI."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from t5like.training import dcn
from train_helpers import REPO, subprocess_env, tiny_config

HLO = """
  %send.1 = (f32[8,128]{1,0}, u32[], token[]) send(f32[8,128]{1,0} %p, token[] %t), channel_id=3, frontend_attributes={_xla_megascale_target="1",_xla_host_transfer_handler_name="x"}
  %send-done.1 = token[] send-done((f32[8,128]{1,0}, u32[], token[]) %send.1), frontend_attributes={_xla_megascale_target="1"}
  %recv.2 = (bf16[64]{0}, u32[], token[]) recv(token[] %t), frontend_attributes={_xla_megascale_source="0"}
  %all-reduce.3 = f32[1024]{0} all-reduce(f32[1024]{0} %g), replica_groups={{0,1}}
"""


def test_megascale_bytes_reads_the_host_transfers_only():
  t = dcn.megascale_bytes(HLO)
  assert t == {"send": 8 * 128 * 4, "recv": 64 * 2, "ops": 2,  # Not the -done ops, nor ICI.
               "loops_uncounted": 0}
  assert dcn.dcn_seconds(t, "v5p") == pytest.approx(8 * 128 * 4 / (50e9 / 8))
  assert dcn.dcn_seconds(t, "v4") is None  # No published figure: no DCN term.


LOOP = """
%body (p: (s32[], f32[64])) -> (s32[], f32[64]) {
  %p = (s32[], f32[64]) parameter(0)
  %send.5 = (f32[64,128]{1,0}, u32[], token[]) send(%g, %t), frontend_attributes={_xla_megascale_target="1"}
}

%cond (q: (s32[], f32[64])) -> pred[] {
  %q = (s32[], f32[64]) parameter(0)
  %i = s32[] get-tuple-element(%q), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (x: f32[64]) -> f32[64] {
  %one = s32[] constant(1)
  %start = s32[]{:T(128)} copy(%one)
  %init = (s32[], f32[64]) tuple(%start, %x)
  %while.1 = (s32[], f32[64]) while(%init), condition=%cond, body=%body
  %send.6 = (f32[16]{0}, u32[], token[]) send(%y, %t), frontend_attributes={_xla_megascale_target="1"}
}
"""


def test_megascale_bytes_counts_a_loop_body_once_per_iteration():
  """XLA reduces a scanned layer's gradients over DCN inside the backward loop (its first
  iteration peeled off, the counter starting at 1): the body's bytes count 3 times here."""
  t = dcn.megascale_bytes(LOOP)
  assert t["send"] == 3 * 64 * 128 * 4 + 16 * 4 and t["ops"] == 2 and t["loops_uncounted"] == 0
  unknown = dcn.megascale_bytes(LOOP.replace("constant(4)", "parameter(1)"))
  assert unknown["send"] == 64 * 128 * 4 + 16 * 4 and unknown["loops_uncounted"] == 1


def _tiny(dcn_axis: str):
  cfg = tiny_config("decllm", batch_size=32, length=64)
  cfg.mesh.dcn_axis = dcn_axis
  return cfg


@pytest.mark.aot
@pytest.mark.timeout(1800)
def test_two_v5e_slices_charge_the_gradient_reduction_to_dcn():
  from t5like.training import aot
  chip, devices = aot.topology_devices("v5e-8", num_slices=2)
  assert {d.slice_index for d in devices} == {0, 1}
  dp = aot.compile_report(_tiny("data"), devices, chip=chip, eval_step=False)
  assert dp["slices"] == 2 and dp["mesh"]["dcn"] == 2 and dp["mesh"]["fsdp"] == 8
  state = dp["train"]["arguments"]  # Upper bound: all a chip holds (state and batch).
  # Data parallelism over DCN: each chip exchanges its gradient shard with the other slice.
  assert 0 < dp["dcn_traffic"]["send"] <= state and dp["dcn_s"] > 0
  assert dp["step_serial_s"] == pytest.approx(
      dp["compute_s"] + dp["hbm_s"] + dp["ici_s"] + dp["dcn_s"])
  fsdp = aot.compile_report(_tiny("fsdp"), devices, chip=chip, eval_step=False)
  assert fsdp["mesh"]["dcn"] == 1 and fsdp["mesh"]["fsdp"] == 16
  # FSDP over DCN: the parameter all-gathers cross DCN too, every step.
  assert fsdp["dcn_traffic"]["send"] > dp["dcn_traffic"]["send"]


@pytest.mark.aot
@pytest.mark.timeout(1800)
def test_dcn_bytes_of_a_scanned_model_are_its_gradient_shard():
  """Data parallelism over two slices: each chip sends its f32 gradient shard over DCN once a
  step (half to the peer, half back reduced) — layer by layer inside the backward scan, whose
  iterations must all count (counted once, the bytes came out at half the shard)."""
  from t5like.training import aot
  chip, devices = aot.topology_devices("v5e-8", num_slices=2)
  cfg = tiny_config("decllm", batch_size=32, length=128)
  m = cfg.model
  m.num_layers, m.d_model, m.d_ff, m.num_heads, m.head_dim = 4, 512, 1024, 4, 128
  r = aot.compile_report(cfg.validate(), devices, chip=chip, eval_step=False)
  shard = r["num_params"] * 4 / r["mesh"]["fsdp"]
  assert r["dcn_traffic"]["loops_uncounted"] == 0
  assert 0.95 * shard < r["dcn_traffic"]["send"] < 1.1 * shard


@pytest.mark.aot
@pytest.mark.timeout(1800)  # Two TPU compiles (train and eval step): minutes on a busy host.
def test_train_py_compile_only_for_slices_that_need_not_exist(tmp_path):
  proc = subprocess.run(
      [sys.executable, os.path.join(REPO, "train.py"), "--config",
       os.path.join(REPO, "configs", "tiny_decllm.py"), "--compile_only", "--topology", "v5e-4",
       "--num_slices", "2"], cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True,
      timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "8 x TPU v5 lite (2 slices over DCN)" in proc.stdout and "'dcn': 2" in proc.stdout
  assert re.search(r"roofline: .* ICI .*, DCN [0-9.]+ (ms|s) \(", proc.stdout), proc.stdout
  assert "eval step per chip" in proc.stdout
  bad = subprocess.run(
      [sys.executable, os.path.join(REPO, "train.py"), "--compile_only", "--num_slices", "2"],
      cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=300)
  assert bad.returncode == 2 and "--num_slices needs --topology" in bad.stderr


@pytest.mark.aot
@pytest.mark.parametrize("topology", ["v5p-128", "2xv5p-128"])
def test_an_expert_axis_no_torus_axis_matches_gets_an_ici_aware_mesh(topology):
  """An 8-way expert axis on v5p's 4x4x4 torus is no product of its axes: the mesh splits the
  physical axes (jax's builders refuse otherwise; the multi-slice one, for the MoE rows of the
  table, raised) instead of falling back to row-major order, and each DCN index is one slice."""
  from jax.experimental import mesh_utils

  from t5like import partitioning
  from t5like.config.train import MeshConfig
  from t5like.training import aot
  _, devices = aot.topology_devices(topology)
  mesh = partitioning.make_mesh(MeshConfig(expert=8), devices)
  slices = partitioning.device_slices(devices)
  assert dict(mesh.shape) == {"dcn": slices, "data": 1, "expert": 8, "fsdp": 8, "tensor": 1}
  per = len(devices) // slices
  for s in range(slices):
    grid = mesh.devices[s]
    assert {getattr(d, "slice_index", 0) for d in grid.flat} == {s}
    split = mesh_utils.create_device_mesh((1, 8, 8, 1), devices=devices[s * per:(s + 1) * per],
                                          allow_split_physical_axes=True)
    assert [d.id for d in grid.flat] == [d.id for d in split.flat]
    assert [d.id for d in grid.flat] != sorted(d.id for d in grid.flat)  # Not row-major.
