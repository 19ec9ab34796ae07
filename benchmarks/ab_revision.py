#!/usr/bin/env python
"""A git revision's train step or ``generate`` call against the working tree's, alternating in
one process.

  python benchmarks/ab_revision.py [--base HEAD] [--only small_decllm,small_redllm]
                                   [--dtype float32] [--repeats 6] [--steps 3]
  python benchmarks/ab_revision.py --generate [--cases 8x128+64,1x128+64] [--base HEAD] ...

On the shared 2-core hosts the same benchmark moves 10-30 % between processes minutes apart,
more than most single changes gain; within one process, alternating short bursts, both sides
see the same machine. The base revision's ``t5like`` (``git archive``) is imported first and its
steps compiled, then its modules are dropped from ``sys.modules`` and the working tree's are
imported and compiled: each compiled step keeps the code it was traced from. Each of
``--repeats`` rounds times ``--steps`` calls of every case on each side (the side that goes
first alternates); the table gives per-side medians and the ratio of medians (base / new > 1:
the working tree is faster). Train steps: ``t5like.config.presets.BENCHMARK_CONFIGS``
(``train_throughput.py``'s ``CONFIGS`` in revisions before they moved). ``--generate``:
``generate`` of the small models of ``decode_throughput.py`` (both families),
``batch x prompt + new`` tokens, no EOS.
"""
from __future__ import annotations

import argparse
import importlib
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # This checkout's timing; each side's t5like is imported later.
from benchmarks import timing  # noqa: E402
sys.path.remove(REPO)


def _export(rev: str, dest: str) -> str:
  """The revision's ``t5like/`` and ``benchmarks/`` under ``dest``; returns ``dest``."""
  tar = subprocess.run(["git", "-C", REPO, "archive", rev, "t5like", "benchmarks"],
                       check=True, capture_output=True).stdout
  path = os.path.join(dest, "archive.tar")
  with open(path, "wb") as f:
    f.write(tar)
  with tarfile.open(path) as t:
    try:
      t.extractall(dest, filter="data")
    except TypeError:  # Python releases before extraction filters (3.10.11 and older).
      t.extractall(dest)
  _share_built_kernels(dest)
  return dest


def _share_built_kernels(dest: str) -> None:
  """The working tree's built CPU kernels (``t5like/kernels/_cpu*.so``, not in git) for the
  exported revision too, where its kernel sources are the same; else it runs without them."""
  src, out = os.path.join(REPO, "t5like", "kernels"), os.path.join(dest, "t5like", "kernels")
  if not os.path.isdir(out):
    return
  sources = sorted(f for f in os.listdir(out) if f.endswith((".cc", ".h")))
  same = sources == sorted(f for f in os.listdir(src) if f.endswith((".cc", ".h"))) and all(
      open(os.path.join(src, f), "rb").read() == open(os.path.join(out, f), "rb").read()
      for f in sources)
  built = [f for f in os.listdir(src) if f.startswith("_cpu") and f.endswith(".so")]
  if same and built:
    for f in built:
      shutil.copy(os.path.join(src, f), out)
  else:
    print("note: the base revision runs without the CPU kernels (its kernel sources differ "
          "from the working tree's, or none are built)", file=sys.stderr)


def _load(root: str, *names: str) -> list:
  """Imports ``names`` (modules of ``t5like`` or of ``benchmarks/``) from ``root``, after
  dropping every module either side imported before."""
  for name in [m for m in sys.modules if m == "t5like" or m.startswith("t5like.")
               or m in ("train_throughput", "decode_throughput", "benchmarks.train_throughput",
                        "benchmarks.decode_throughput")]:
    del sys.modules[name]
  paths = [root, os.path.join(root, "benchmarks")]
  sys.path[:0] = paths
  try:
    mods = [importlib.import_module(n) for n in names]
    t5like = sys.modules["t5like"]
    assert os.path.realpath(t5like.__file__).startswith(os.path.realpath(root)), t5like.__file__
  finally:
    for p in paths:
      sys.path.remove(p)
  return mods


def _benchmark_configs(root: str) -> tuple[dict, dict]:
  """The side's benchmark configs by name and their fixed dtypes: ``t5like.config.presets``
  (its ``t5like`` is loaded already), or ``train_throughput.py`` in older revisions."""
  try:
    presets = importlib.import_module("t5like.config.presets")
    return presets.BENCHMARK_CONFIGS, presets.BENCHMARK_FIXED_DTYPE
  except (ImportError, AttributeError):
    sys.path.insert(0, os.path.join(root, "benchmarks"))
    try:
      tt = importlib.import_module("train_throughput")
    finally:
      sys.path.remove(os.path.join(root, "benchmarks"))
    return tt.CONFIGS, tt.FIXED_DTYPE


def _prepare_train(root: str, names: list[str], dtype: str) -> dict:
  """name -> a closure running one compiled train step of that config (compiled here)."""
  import jax
  step_lib, state_lib, data, partitioning = _load(
      root, "t5like.training.step", "t5like.training.state", "t5like.training.data",
      "t5like.partitioning")
  configs, fixed_dtype = _benchmark_configs(root)
  out = {}
  for name in names:
    cfg = configs[name]()
    cfg.model.dtype = fixed_dtype.get(name, dtype)
    cfg.validate()
    setup = state_lib.build_setup(cfg, partitioning.make_mesh(cfg.mesh))
    it = data.SyntheticData(cfg).train(cfg.train.batch_size, 0, 1)
    batch = data.global_batch(next(it), setup.batch_sharding, cfg.train.batch_size)
    train_step = step_lib.make_train_step(setup)
    box = [state_lib.init_state(setup)]

    def run(train_step=train_step, box=box, batch=batch):
      box[0], metrics = train_step(box[0], batch)
      jax.block_until_ready((box[0], metrics))  # All outputs: none may run into the next timing.
    run()  # Compiles.
    out[name] = run
  return out


def _decode_benchmark(root: str):
  """The side's ``decode_throughput.py`` (its ``parse_case`` and ``small_model_config``)."""
  sys.path[:0] = [root, os.path.join(root, "benchmarks")]
  try:
    if os.path.exists(os.path.join(root, "benchmarks", "__init__.py")):
      return importlib.import_module("benchmarks.decode_throughput")
    return importlib.import_module("decode_throughput")
  finally:
    sys.path.remove(root)
    sys.path.remove(os.path.join(root, "benchmarks"))


def _prepare_generate(root: str, cases: list[str], dtype: str) -> dict:
  """"family batch x prompt + new" -> a closure running one ``generate`` call (compiled here)."""
  import numpy as np
  from flax import nnx
  inference, models = _load(root, "t5like.inference", "t5like.models")
  dt = _decode_benchmark(root)
  out = {}
  for case in cases:
    batch, prompt, new = dt.parse_case(case)
    for family in ("decllm", "redllm"):
      cfg = dt.small_model_config(family, dtype)
      model = models.build_model(cfg, nnx.Rngs(0))
      rng = np.random.RandomState(0)
      prompts = [rng.randint(2, cfg.vocab_size, size=prompt).tolist() for _ in range(batch)]

      def run(model=model, prompts=prompts, new=new, generate=inference.generate):
        generate(model, prompts, max_new_tokens=new, eos_id=-1)
      run()  # Compiles.
      out[f"{family} {case}"] = run
  return out


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--base", default="HEAD", help="git revision to compare the working tree with")
  ap.add_argument("--only", default="small_decllm,small_redllm", help="train step configs")
  ap.add_argument("--generate", action="store_true", help="time generate calls, not train steps")
  ap.add_argument("--cases", default="8x128+64,1x128+64", help="with --generate")
  timing.add_dtype_flag(ap, "float32")
  timing.add_repeats_flag(ap, 6, "rounds of --steps calls a side")
  ap.add_argument("--steps", type=int, default=3, help="calls per side and case in a round")
  args = ap.parse_args()
  prepare = _prepare_generate if args.generate else _prepare_train
  items = [n for n in (args.cases if args.generate else args.only).split(",") if n]
  with tempfile.TemporaryDirectory() as tmp:
    sides = {"base": prepare(_export(args.base, tmp), items, args.dtype)}
    sides["new"] = prepare(REPO, items, args.dtype)
  names = list(sides["new"])
  keys = [(s, n) for s in ("base", "new") for n in names]
  times = dict(zip(keys, timing.alternating([sides[s][n] for s, n in keys], args.repeats,
                                            calls_per_round=args.steps)))
  from t5like import runtime
  what = "call" if args.generate else "step"
  print(f"\nbase {args.base} against the working tree, {args.dtype}, {args.repeats} rounds x "
        f"{args.steps} {what}s a side; {runtime.huge_pages_state()}\n")
  print(f"| {'case' if args.generate else 'config'} | base {what} ms | new {what} ms | "
        "base / new |")
  print("|---|---|---|---|")
  for name in names:
    b, n = (statistics.median(times[s, name]) * 1e3 for s in ("base", "new"))
    print(f"| {name} | {b:.0f} | {n:.0f} | {b / n:.3f}x |")


if __name__ == "__main__":
  sys.path.insert(0, REPO)
  from t5like import runtime  # noqa: E402
  sys.path.remove(REPO)  # Each side's t5like is imported afresh (``_load``).
  main()
