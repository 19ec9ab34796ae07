"""Docker images and launchers, checked as far as a machine without Docker or gcloud allows: the
Dockerfiles parse and install extras that exist, the launchers' commands (dry run) put the image
on every TPU worker before running, and pass train.py's arguments through intact; the install
step of each image resolves against the package index (slow)."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCKERFILES = ["docker/tpu.Dockerfile", "docker/gpu.Dockerfile"]
INSTRUCTIONS = {"FROM", "ENV", "RUN", "WORKDIR", "COPY", "CMD", "ARG", "LABEL", "ENTRYPOINT",
                "EXPOSE", "USER", "VOLUME", "SHELL"}


def _instructions(path: str) -> list[tuple[str, str]]:
  text = open(os.path.join(REPO, path)).read()
  logical = re.sub(r"\\\n", " ", text)  # Line continuations.
  out = []
  for line in logical.splitlines():
    line = line.strip()
    if line and not line.startswith("#"):
      word, _, rest = line.partition(" ")
      out.append((word, rest.strip()))
  return out


def _pyproject() -> tuple[set[str], str]:
  """(extras, requires-python) of pyproject.toml (read by hand: tomllib needs Python 3.11)."""
  text = open(os.path.join(REPO, "pyproject.toml")).read()
  section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
  extras = set(re.findall(r"^([A-Za-z0-9_-]+)\s*=", section, re.M))
  return extras, re.search(r'requires-python\s*=\s*"([^"]+)"', text).group(1)


@pytest.mark.parametrize("path", DOCKERFILES)
def test_dockerfile_parses_and_installs_existing_extras(path):
  steps = _instructions(path)
  assert steps[0][0] == "FROM" and all(word in INSTRUCTIONS for word, _ in steps), steps
  for word, rest in steps:
    if word == "COPY":
      *sources, _dest = rest.split()
      for src in sources:
        assert src == "." or os.path.exists(os.path.join(REPO, src)), (path, src)
  extras, requires = _pyproject()
  installs = [m for _, rest in steps for m in re.findall(r"pip install -e '\.\[([a-z,]+)\]'",
                                                          rest)]
  assert installs, f"{path} installs no extras"
  for group in installs:
    for extra in group.split(","):
      assert extra in extras, (path, extra, sorted(extras))
  python = re.search(r"python:?(3\.\d+)", " ".join(r for _, r in steps)).group(1)
  low, high = re.findall(r"3\.(\d+)", requires)
  assert int(low) <= int(python.split(".")[1]) < int(high), python
  cmd = dict(steps)["CMD"]
  assert "train.py" in cmd and os.path.exists(os.path.join(REPO, "train.py"))


@pytest.mark.parametrize("script", ["docker/launch_tpu.sh", "docker/launch_gpu.sh"])
def test_launchers_are_valid_bash(script):
  subprocess.run(["bash", "-n", os.path.join(REPO, script)], check=True)


TRAIN_ARGS = ["--config", "configs/redllm_8b.py", "--workdir", "gs://bucket/runs/red 8b",
              "--config.data.data_dir=gs://bucket/redpajama"]


def _dry_run(**env) -> list[list[str]]:
  proc = subprocess.run(["bash", os.path.join(REPO, "docker/launch_tpu.sh"), *TRAIN_ARGS],
                        env={**os.environ, "TPU": "my-v5p", "ZONE": "us-east5-a", "DRY_RUN": "1",
                             **env}, capture_output=True, text=True, check=True)
  return [shlex.split(line) for line in proc.stdout.splitlines()]


def _remote(cmd: list[str]) -> str:
  assert cmd[:4] == ["gcloud", "compute", "tpus", "tpu-vm"] and "--worker=all" in cmd, cmd
  return cmd[cmd.index("--command") + 1] if "--command" in cmd else ""


def test_tpu_launcher_builds_the_image_on_every_worker_then_runs():
  git, scp, build, train = _dry_run()
  assert git[:2] == ["git", "-C"] and "archive" in git
  assert scp[4] == "scp" and "--worker=all" in scp
  assert "docker build" in _remote(build) and "t5like/docker/tpu.Dockerfile" in _remote(build)
  remote = shlex.split(_remote(train))
  assert remote[:3] == ["sudo", "docker", "run"] and "t5like:tpu" in remote
  assert remote[remote.index("train.py") + 1:] == TRAIN_ARGS  # Quoting survives two shells.


def test_tpu_launcher_pulls_a_registry_image_on_every_worker():
  image = "us-docker.pkg.dev/proj/repo/t5like:tpu"
  pull, train = _dry_run(IMAGE=image, PROJECT="proj", DOCKER="docker")
  assert _remote(pull) == f"docker pull {image}" and "--project" in pull
  remote = shlex.split(_remote(train))
  assert image in remote and remote[remote.index("train.py") + 1:] == TRAIN_ARGS


@pytest.mark.slow  # Resolves every dependency of the images against the package index.
@pytest.mark.parametrize("extras", ["tpu,test", "gpu,test"])
def test_image_install_step_resolves(extras, tmp_path):
  report = tmp_path / "report.json"
  proc = subprocess.run(
      [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
       "--report", str(report), f".[{extras}]"], cwd=REPO, capture_output=True, text=True,
      timeout=1200)
  assert proc.returncode == 0, proc.stderr[-3000:]
  names = {item["metadata"]["name"].lower() for item in __import__("json").loads(
      report.read_text())["install"]}
  assert {"jax", "flax", "optax", "orbax-checkpoint", "seqio"} <= names
  assert ("libtpu" in names) if extras.startswith("tpu") else any("cuda" in n for n in names)


def _ignored(path: str, patterns: list[str]) -> bool:
  """Whether Docker's context leaves ``path`` out (the patterns used here: globs, ``**/``)."""
  import fnmatch
  parts = path.split("/")
  prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
  for pattern in patterns:
    if pattern.startswith("**/"):
      tail = pattern[3:]
      if any(fnmatch.fnmatch(p.rsplit("/", 1)[-1], tail) or fnmatch.fnmatch(p, tail)
             for p in prefixes):
        return True
    elif any(fnmatch.fnmatch(p, pattern) for p in prefixes):
      return True
  return False


def test_the_build_context_leaves_out_what_the_host_built_or_ran():
  text = open(os.path.join(REPO, ".dockerignore")).read()
  patterns = [p.strip().rstrip("/") for p in text.splitlines()
              if p.strip() and not p.startswith("#")]
  for path in (".venv/bin/python",
               ".venv-tpu/lib/x.py", "runs/tiny_decllm/checkpoints/1/state", "workdirs/a/b",
               ".git/HEAD", "t5like/models/__pycache__/layers.cpython-311.pyc", "build/lib/x",
               "t5like.egg-info/PKG-INFO"):
    assert _ignored(path, patterns), path
  for path in ("t5like/models/layers.py", "configs/tiny_decllm.py",
               "pyproject.toml", "README.md", "train.py",
               "t5like/data/embedded/spm.model"):
    assert not _ignored(path, patterns), path


def test_beam_worker_image_matches_the_pinned_beam_and_installs_the_extra():
  steps = _instructions("docker/beam.Dockerfile")
  assert steps[0][0] == "FROM" and all(word in INSTRUCTIONS for word, _ in steps), steps
  text = open(os.path.join(REPO, "pyproject.toml")).read()
  pinned = re.search(r'"apache-beam==([\d.]+)"', text).group(1)
  base = re.fullmatch(r"apache/beam_python(3\.\d+)_sdk:([\d.]+)", steps[0][1])
  assert base and base.group(2) == pinned, (steps[0][1], pinned)  # Workers run the driver's SDK.
  low, high = re.findall(r"3\.(\d+)", _pyproject()[1])
  assert int(low) <= int(base.group(1).split(".")[1]) < int(high)
  assert any(re.search(r"pip install -e '\.\[beam\]'", rest) for _, rest in steps)
  assert "ENTRYPOINT" not in dict(steps) and "CMD" not in dict(steps)  # The SDK harness's boot.
