"""Multi-slice meshes (``mesh.slices``): the slices join the mesh's ``dcn`` axis (data parallelism
over DCN) or, by choice, its ``fsdp`` axis; the batch is split over (dcn, data, expert, fsdp).

- the hybrid builder groups devices by ``slice_index`` (TPU slices) or by process (GPU / CPU
  processes), one block of the mesh per slice;
- a batch the DCN axis does not divide is an error before anything compiles;
- two processes on localhost, each one "slice" (jax.distributed, gloo), train step for step as
  one process does on the same global batches, and a checkpoint written on the two-slice mesh
  resumes on one process and back.
"""
from __future__ import annotations

import dataclasses
import json
import socket
import subprocess

import pytest

from t5like import partitioning
from t5like.config import ConfigError
from t5like.config.train import MeshConfig
from numerics import assert_close_to_scale
from train_helpers import (REPO, losses_by_step, run_script, runner_command, subprocess_env,
                           tiny_config)


@dataclasses.dataclass(frozen=True)
class FakeDevice:
  id: int
  slice_index: int
  process_index: int = 0
  device_kind: str = "cpu"
  platform: str = "cpu"


def test_hybrid_mesh_puts_each_slice_in_its_own_block():
  devices = [FakeDevice(i, i // 4) for i in range(8)][::-1]  # Unordered, as a pod may list them.
  ici, slices = (1, 1, 1, 4, 1), 2
  grid = partitioning._hybrid_grid(ici, (2, 1, 1, 1, 1), devices, slices)  # dcn_axis="data"
  assert grid.shape == (2, 1, 1, 4, 1)
  assert [{d.slice_index for d in grid[i].ravel()} for i in range(2)] == [{0}, {1}]
  grid = partitioning._hybrid_grid((1, 2, 1, 2, 1), (1, 1, 1, 2, 1), devices, slices)  # "fsdp"
  assert grid.shape == (1, 2, 1, 4, 1)
  assert [[d.slice_index for d in row] for row in grid[0, :, 0, :, 0]] == [[0, 0, 1, 1]] * 2
  # The devices' own slices decide; a different mesh.slices is an error naming the right one.
  assert partitioning.num_slices(MeshConfig(), devices) == 2
  with pytest.raises(ConfigError, match="mesh.slices=2 or 0"):
    partitioning.num_slices(MeshConfig(slices=4), devices)
  with pytest.raises(ConfigError, match="dcn_axis"):
    MeshConfig(dcn_axis="tensor").validate()


MESH_SCRIPT = r"""
import json, tempfile
import jax
from t5like import partitioning
from t5like.config import ConfigError
from t5like.training import loop
from t5like.training.data import SyntheticData
from train_helpers import tiny_config
out = {}
cfg = tiny_config("decllm", batch_size=8); cfg.mesh.slices = 2
mesh = partitioning.make_mesh(cfg.mesh)
out["data"] = [dict(mesh.shape), list(partitioning.batch_sharding(mesh).spec)]
cfg.mesh.dcn_axis, cfg.mesh.fsdp, cfg.mesh.data = "fsdp", 2, -1
out["fsdp"] = dict(partitioning.make_mesh(cfg.mesh).shape)
bad = tiny_config("decllm", batch_size=6); bad.mesh.slices, bad.mesh.fsdp = 4, 1
bad.mesh.data = -1
try:
  loop.run(bad, tempfile.mkdtemp(), data=SyntheticData(bad))
except ConfigError as e:
  out["error"] = str(e)
print("REPORT " + json.dumps(out))
"""


def test_make_mesh_on_slices_and_the_dcn_batch_check():
  proc = run_script(MESH_SCRIPT, devices=8, timeout=240)
  r = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")][-1][7:])
  shape, spec = r["data"]
  assert shape == {"dcn": 2, "data": 1, "expert": 1, "fsdp": 4, "tensor": 1}
  assert spec == [["dcn", "data", "expert", "fsdp"], None]
  # FSDP over DCN: each slice's fsdp=2 doubled across the two slices; data=2 inside each.
  assert r["fsdp"] == {"dcn": 1, "data": 2, "expert": 1, "fsdp": 2 * 2, "tensor": 1}
  # 6 rows over 4 slices: refused by loop.run's checks before anything is built or compiled.
  assert "split over the 4 slices" in r["error"] and "mesh.slices" in r["error"]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _run(cfg, workdir, processes: int, start: int) -> None:
  """Trains ``cfg`` in ``workdir`` on ``processes`` processes of 2 (or, alone, 4) CPU devices,
  on the global synthetic batches from batch ``start``."""
  address = f"127.0.0.1:{_free_port()}"
  procs = []
  for pid in range(processes):
    dist = {"coordinator_address": address, "num_processes": processes, "process_id": pid}
    cmd = runner_command(cfg, workdir, data="global", data_start=start,
                         **({"distributed": dist} if processes > 1 else {}))
    procs.append(subprocess.Popen(cmd, cwd=REPO, env=subprocess_env(devices=4 // processes),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  try:
    for p in procs:
      _, err = p.communicate(timeout=1500)
      assert p.returncode == 0, err[-5000:]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()


def _config(steps: int, slices: int):
  cfg = tiny_config("redllm", steps=steps)
  cfg.train.warmup_steps, cfg.train.decay_steps = 0, 6  # One schedule whatever train.steps.
  cfg.checkpoint.every, cfg.checkpoint.restore_data = 2, False  # Restarts: the test says where.
  cfg.mesh.slices, cfg.mesh.fsdp = slices, -1
  return cfg


@pytest.mark.slow  # Six training processes one after the other: ~3-4 min on 2 idle cores.
@pytest.mark.timeout(3600)
def test_two_slices_over_dcn_train_as_one_process_and_checkpoints_cross(tmp_path):
  """Two processes, one slice each (mesh dcn=2 x fsdp=2), against one process on 4 devices
  (fsdp=4), on the same global batches: the same loss at every step, also across resumes from a
  checkpoint written on the other layout (two slices -> one process -> two slices)."""
  one, mixed = str(tmp_path / "one"), str(tmp_path / "mixed")
  _run(_config(6, 1), one, processes=1, start=0)
  _run(_config(2, 2), mixed, processes=2, start=0)  # Steps 1-2 on two slices,
  _run(_config(4, 1), mixed, processes=1, start=2)  # 3-4 on one process from their checkpoint,
  _run(_config(6, 2), mixed, processes=2, start=4)  # 5-6 on two slices again.
  ref, got = losses_by_step(one), losses_by_step(mixed)
  assert sorted(ref) == sorted(got) == [1, 2, 3, 4, 5, 6]
  for step in ref:
    assert len(got[step]) == 1  # Each step ran once: every resume started where the last ended.
    assert_close_to_scale(got[step][0], ref[step][0], err_msg=f"step {step}")
  assert ref[6][0] < ref[1][0]  # It did train.
