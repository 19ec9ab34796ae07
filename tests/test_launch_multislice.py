"""docker/launch_tpu_multislice.sh, dry run: the queued resource of NODES slices, the image on
every worker of every slice, then train.py on each with its slice's MEGASCALE variables."""
from __future__ import annotations

import os
import shlex
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "docker", "launch_tpu_multislice.sh")
TRAIN_ARGS = ["--config", "configs/decllm_8b.py", "--workdir", "gs://bucket/runs/dec 8b"]


def _dry_run(**env) -> list[list[str]]:
  proc = subprocess.run(["bash", SCRIPT, *TRAIN_ARGS], capture_output=True, text=True,
                        check=True, env={**os.environ, "QR": "qr", "ZONE": "us-east5-a",
                                         "NODES": "2", "DRY_RUN": "1", **env})
  return [shlex.split(line) for line in proc.stdout.splitlines()]


def test_valid_bash():
  subprocess.run(["bash", "-n", SCRIPT], check=True)


def test_creates_the_slices_and_tells_each_worker_its_slice():
  create, pull0, pull1, run0, run1 = _dry_run(CREATE="1", ACCELERATOR="v5litepod-256",
                                               IMAGE="reg/t5like:tpu")
  assert create[:5] == ["gcloud", "compute", "tpus", "queued-resources", "create"]
  assert create[create.index("--node-count") + 1] == "2"
  assert create[create.index("--runtime-version") + 1] == "v2-alpha-tpuv5-lite"
  for i, (pull, run) in enumerate([(pull0, run0), (pull1, run1)]):
    assert pull[5] == run[5] == f"qr-{i}" and "--worker=all" in run
    remote = shlex.split(run[run.index("--command") + 1])
    env = dict(remote[j + 1].split("=", 1) for j, w in enumerate(remote) if w == "-e")
    assert env["MEGASCALE_SLICE_ID"] == str(i) and env["MEGASCALE_NUM_SLICES"] == "2"
    assert env["MEGASCALE_COORDINATOR_ADDRESS"].endswith(":8080")
    assert remote[remote.index("train.py") + 1:] == TRAIN_ARGS  # Quoting survives two shells.


def test_without_an_image_builds_this_checkout_on_every_slice():
  cmds = _dry_run()
  assert cmds[0][:2] == ["git", "-C"]
  assert sum(c[4] == "scp" for c in cmds if c[0] == "gcloud") == 2
  builds = [c for c in cmds if "--command" in c and "docker build" in c[c.index("--command") + 1]]
  assert [c[5] for c in builds] == ["qr-0", "qr-1"]
