#!/usr/bin/env python
"""A/B rows of XLA GPU flags: a benchmark run once per flag variant, each in a fresh subprocess
(XLA reads XLA_FLAGS, and JAX its ``JAX_*`` settings, once, when the backend starts), the rows
stamped with the variant, its flags, the card, the JAX version and the date.

  python benchmarks/gpu_flags.py --bench decode|train [--variants default,no_command_buffer]
                                 [--timeout_s 90] [--json out.json] [--smoke] [-- BENCH ARGS]
  python benchmarks/gpu_flags.py --check [--variants ...]    (do the flags parse here?)

``--bench`` is ``decode`` (``gpu_decode.py``), ``train`` (``gpu_train.py``) or a script path;
arguments after ``--`` go to it. A variant that does not parse (XLA aborts on a flag its version
does not know), crashes or runs out of time gives a row saying so; the rows it saved before
(the benchmarks save as they go) are kept. ``--check`` starts JAX on the CPU once per variant:
XLA parses every flag, GPU ones included, on any backend.

Nothing here changes what the project sets: every variant is off by default until a measurement
in docs/gpus.md says it helps.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHES = {"decode": os.path.join(HERE, "gpu_decode.py"),
           "train": os.path.join(HERE, "gpu_train.py")}


@dataclasses.dataclass(frozen=True)
class Variant:
  """One A/B arm: XLA flags and JAX settings (environment variables) added to the default."""
  name: str
  xla_flags: tuple[str, ...] = ()
  env: tuple[tuple[str, str], ...] = ()
  why: str = ""


VARIANTS = {v.name: v for v in (
    Variant("default", why="XLA's own defaults (command buffers for its default command types)"),
    Variant("no_command_buffer", ("--xla_gpu_enable_command_buffer=",),
            why="no CUDA graphs: every thunk launched one by one"),
    Variant("command_buffer_while", ("--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL",),
            why="decode's while loop (and its condition) captured into CUDA graphs too"),
    Variant("command_buffer_min1", ("--xla_gpu_graph_min_graph_size=1",),
            why="even short runs of kernels captured into a graph (XLA's default needs more)"),
    Variant("latency_hiding", ("--xla_gpu_enable_latency_hiding_scheduler=true",),
            why="the latency-hiding scheduler (overlap of copies/collectives with compute)"),
    Variant("no_triton_gemm", ("--xla_gpu_enable_triton_gemm=false",),
            why="products only through cuBLAS / cuBLASLt, no Triton GEMM fusions"),
    Variant("ragged_dot_cudnn", ("--xla_gpu_experimental_use_ragged_dot_fusion=true",),
            why="MoE dropless: XLA's ragged-dot as a cuDNN grouped GEMM (experimental)"),
    Variant("ragged_dot_triton", env=(("JAX_RAGGED_DOT_USE_GPU_PALLAS_TRITON_LOWERING", "1"),),
            why="MoE dropless: JAX's Pallas Triton lowering of ragged_dot (where the JAX has it)"),
)}


def variant_env(variant: Variant, base: dict | None = None) -> dict:
  """The environment of a subprocess running ``variant``: ``base`` (default os.environ) with the
  variant's flags appended to XLA_FLAGS (later flags win) and its JAX settings."""
  env = dict(os.environ if base is None else base)
  flags = " ".join([env.get("XLA_FLAGS", ""), *variant.xla_flags]).strip()
  if flags:
    env["XLA_FLAGS"] = flags
  env.update(dict(variant.env))
  return env


def _probe(variant: Variant, timeout_s: float) -> str:
  """"ok" if JAX starts (on the CPU) under ``variant``, else the first line of its refusal."""
  probe = "import jax, jax.numpy as jnp; jax.jit(lambda x: x + 1)(jnp.ones(2)).block_until_ready()"
  env = variant_env(variant)
  env["JAX_PLATFORMS"] = "cpu"
  p = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                     timeout=timeout_s)
  lines = [ln for ln in (p.stderr + p.stdout).splitlines() if ln.strip()]
  bad = [ln for ln in lines if "Unknown flag" in ln or "Illegal value" in ln or "rror" in ln]
  return "ok" if p.returncode == 0 else (bad or lines or [f"exit {p.returncode}"])[0][:300]


def check(names: list[str], timeout_s: float = 120) -> dict[str, str]:
  """Per variant: "ok", or the first line XLA or JAX printed when it refused the flags. One
  start with every variant's flags at once (a repeated flag: the last wins, each value parsed);
  one per variant only when that fails, to name the culprits."""
  every = Variant("all", tuple(f for n in names for f in VARIANTS[n].xla_flags),
                  tuple(kv for n in names for kv in VARIANTS[n].env))
  if _probe(every, timeout_s) == "ok":
    return {name: "ok" for name in names}
  return {name: _probe(VARIANTS[name], timeout_s) for name in names}


def run_variant(script: str, bench_args: list[str], variant: Variant, timeout_s: float) -> list:
  """Rows of ``script`` run under ``variant`` (with ``--json`` to a temporary file), each
  stamped with the variant; a last row says why, when the run failed or timed out."""
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "rows.json")
    cmd = [sys.executable, script, *bench_args, "--json", path]
    print(f"== variant {variant.name}: XLA_FLAGS+={' '.join(variant.xla_flags) or '-'} "
          f"env={dict(variant.env) or '-'}", flush=True)
    start, status = time.time(), "ok"
    try:
      p = subprocess.run(cmd, env=variant_env(variant), timeout=timeout_s)
      if p.returncode:
        status = f"exit {p.returncode}"
    except subprocess.TimeoutExpired:
      status = f"timed out after {timeout_s:.0f} s"
    saved = {}
    if os.path.exists(path):
      with open(path) as f:
        saved = json.load(f)
  stamp = {"variant": variant.name, "xla_flags": " ".join(variant.xla_flags),
           "jax_env": dict(variant.env), "device": saved.get("device", ""),
           "jax": saved.get("jax", ""), "date": saved.get("date", time.strftime("%Y-%m-%d")),
           "xla_flags_seen": saved.get("xla_flags", "")}
  rows = [{**r, **stamp} for r in saved.get("rows", [])]
  if status != "ok":
    rows.append({"row": f"variant {variant.name}: {status}", "error": status,
                 "seconds": time.time() - start, **stamp})
  print(f"== variant {variant.name}: {status}, {len(rows)} rows", flush=True)
  return rows


def _args(argv=None) -> tuple[argparse.Namespace, list[str]]:
  argv = list(sys.argv[1:] if argv is None else argv)
  rest = argv[argv.index("--") + 1:] if "--" in argv else []
  own = argv[:argv.index("--")] if "--" in argv else argv
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--bench", default="decode", help="decode, train or a benchmark script path")
  ap.add_argument("--variants", default="default,no_command_buffer,command_buffer_while",
                  help=f"comma list of {', '.join(VARIANTS)}; or all")
  ap.add_argument("--timeout_s", type=float, default=90.0, help="seconds per variant")
  ap.add_argument("--json", default="", help="write every variant's rows to this JSON file")
  ap.add_argument("--smoke", action="store_true", help="pass --smoke to the benchmark")
  ap.add_argument("--check", action="store_true", help="only check that the flags parse")
  args = ap.parse_args(own)
  if args.variants == "all":
    args.variants = ",".join(VARIANTS)
  unknown = [v for v in args.variants.split(",") if v and v not in VARIANTS]
  if unknown:
    ap.error(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS)}")
  return args, rest


def main(argv=None) -> list[dict]:
  args, rest = _args(argv)
  names = [v for v in args.variants.split(",") if v]
  if args.check:
    result = check(names)
    for name, status in result.items():
      print(f"  {name}: {status}", flush=True)
    return [{"row": f"parse {k}", "status": v} for k, v in result.items()]
  script = BENCHES.get(args.bench, args.bench)
  bench_args = rest + (["--smoke"] if args.smoke else [])
  rows: list[dict] = []
  for name in names:
    rows += run_variant(script, bench_args, VARIANTS[name], args.timeout_s)
    if args.json:
      with open(args.json, "w") as f:
        json.dump({"bench": args.bench, "args": bench_args, "rows": rows}, f, indent=1)
  return rows


if __name__ == "__main__":
  main()
