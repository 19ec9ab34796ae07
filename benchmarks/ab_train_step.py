#!/usr/bin/env python
"""A git revision's train step against the working tree's, alternating in one process.

  python benchmarks/ab_train_step.py [--base HEAD] [--only small_decllm,small_redllm]
                                     [--dtype float32] [--rounds 6] [--steps 3]

On the shared 2-core hosts the same benchmark moves 10-30 % between processes minutes apart,
more than most single changes gain; within one process, alternating short bursts, both sides
see the same machine. The base revision's ``t5like`` (``git archive``) is imported first and its
steps compiled, then its modules are dropped from ``sys.modules`` and the working tree's are
imported and compiled: each compiled step keeps the code it was traced from. Each round times
``--steps`` steps of every config on each side (the side that goes first alternates); the table
gives per-side medians and the ratio of medians (base / new > 1: the working tree is faster).
"""
from __future__ import annotations

import argparse
import importlib
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _export(rev: str, dest: str) -> str:
  """The revision's ``t5like/`` and ``benchmarks/`` under ``dest``; returns ``dest``."""
  tar = subprocess.run(["git", "-C", REPO, "archive", rev, "t5like", "benchmarks"],
                       check=True, capture_output=True).stdout
  path = os.path.join(dest, "archive.tar")
  with open(path, "wb") as f:
    f.write(tar)
  with tarfile.open(path) as t:
    t.extractall(dest, filter="data")
  return dest


def _load(root: str):
  """Imports ``t5like`` and the throughput benchmark's configs from ``root``."""
  for name in [m for m in sys.modules if m == "t5like" or m.startswith("t5like.")
               or m == "train_throughput"]:
    del sys.modules[name]
  sys.path.insert(0, root)
  sys.path.insert(0, os.path.join(root, "benchmarks"))
  try:
    tt = importlib.import_module("train_throughput")
    step_lib = importlib.import_module("t5like.training.step")
    state_lib = importlib.import_module("t5like.training.state")
    data = importlib.import_module("t5like.training.data")
    partitioning = importlib.import_module("t5like.partitioning")
    assert os.path.realpath(step_lib.__file__).startswith(os.path.realpath(root)), step_lib.__file__
  finally:
    sys.path.remove(root)
    sys.path.remove(os.path.join(root, "benchmarks"))
  return tt, step_lib, state_lib, data, partitioning


def _prepare(root: str, names: list[str], dtype: str) -> dict:
  """name -> a closure running one compiled train step of that config (compiled here)."""
  import jax
  tt, step_lib, state_lib, data, partitioning = _load(root)
  out = {}
  for name in names:
    cfg = tt.CONFIGS[name]()
    cfg.model.dtype = tt.FIXED_DTYPE.get(name, dtype)
    cfg.validate()
    setup = state_lib.build_setup(cfg, partitioning.make_mesh(cfg.mesh))
    it = data.SyntheticData(cfg).train(cfg.train.batch_size, 0, 1)
    batch = data.global_batch(next(it), setup.batch_sharding, cfg.train.batch_size)
    train_step = step_lib.make_train_step(setup)
    box = [state_lib.init_state(setup)]

    def run(train_step=train_step, box=box, batch=batch):
      box[0], metrics = train_step(box[0], batch)
      jax.block_until_ready(metrics)
    run()  # Compiles.
    out[name] = run
  return out


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--base", default="HEAD", help="git revision to compare the working tree with")
  ap.add_argument("--only", default="small_decllm,small_redllm")
  ap.add_argument("--dtype", default="float32")
  ap.add_argument("--rounds", type=int, default=6)
  ap.add_argument("--steps", type=int, default=3, help="steps per side and config in a round")
  args = ap.parse_args()
  names = [n for n in args.only.split(",") if n]
  with tempfile.TemporaryDirectory() as tmp:
    sides = {"base": _prepare(_export(args.base, tmp), names, args.dtype)}
    sides["new"] = _prepare(REPO, names, args.dtype)
  times = {(s, n): [] for s in sides for n in names}
  for r in range(args.rounds):
    for side in (("base", "new") if r % 2 == 0 else ("new", "base")):
      for name in names:
        for _ in range(args.steps):
          t = time.perf_counter()
          sides[side][name]()
          times[side, name].append(time.perf_counter() - t)
  from t5like import runtime
  print(f"\nbase {args.base} against the working tree, {args.dtype}, {args.rounds} rounds x "
        f"{args.steps} steps a side; {runtime.huge_pages_state()}\n")
  print("| config | base step ms | new step ms | base / new |")
  print("|---|---|---|---|")
  for name in names:
    b, n = (statistics.median(times[s, name]) * 1e3 for s in ("base", "new"))
    print(f"| {name} | {b:.0f} | {n:.0f} | {b / n:.3f}x |")


if __name__ == "__main__":
  sys.path.insert(0, REPO)
  from t5like import runtime  # noqa: E402
  runtime.reexec_with_huge_pages()
  sys.path.remove(REPO)
  del sys.modules["t5like.runtime"], sys.modules["t5like"]
  main()
