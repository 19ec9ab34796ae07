"""What ``gpu_train.py`` reports besides its rows: a trace's GPU kernel time by class and the
docs/gpus.md results row; and, run as a script, one table of every row a GPU session saved:

  python benchmarks/gpu_report.py runs/gpu_session      (or JSON files)
"""
from __future__ import annotations

import glob
import gzip
import json
import os
import re

# Kernel names -> what they do (GPU traces: cuBLAS / CUTLASS products, cuDNN / flash attention,
# NCCL collectives); the first matching class wins.
KERNEL_CLASSES = (
    ("attention", re.compile(r"fmha|flash|cudnn|attention|sdpa", re.I)),
    ("collectives", re.compile(r"nccl|all.?reduce|all.?gather|reduce.?scatter|collective", re.I)),
    ("products", re.compile(r"gemm|nvjet|xmma|cublas|cutlass|matmul|dot", re.I)),
)


def gpu_kernel_events(events: list[dict]):
  """The GPU kernels of a Chrome/Perfetto trace's events: complete events on the threads of
  processes named like a GPU; where those have stream threads (the kernels), only those (the
  "XLA Ops" / "XLA Modules" lines repeat the same time)."""
  meta = [e for e in events if e.get("ph") == "M"]
  gpu_pids = {e["pid"] for e in meta if e.get("name") == "process_name"
              and "gpu" in str(e.get("args", {}).get("name", "")).lower()}
  streams = {(e["pid"], e.get("tid")) for e in meta if e.get("name") == "thread_name"
             and e["pid"] in gpu_pids and "stream" in str(e.get("args", {}).get("name")).lower()}
  for e in events:
    if e.get("ph") != "X" or e.get("pid") not in gpu_pids:
      continue
    if streams and (e["pid"], e.get("tid")) not in streams:
      continue
    yield e


def time_split(events: list[dict]) -> dict[str, float]:
  """Milliseconds of GPU kernel time by class, from a trace's events (``gpu_kernel_events``)."""
  out = {"products": 0.0, "attention": 0.0, "collectives": 0.0, "other": 0.0}
  for e in gpu_kernel_events(events):
    cls = next((c for c, rx in KERNEL_CLASSES if rx.search(e.get("name", ""))), "other")
    out[cls] += float(e.get("dur", 0.0)) / 1e3
  return out


def trace_events(profile_dir: str) -> list[dict]:
  """The events of the newest ``jax.profiler`` trace under ``profile_dir`` ([] if none)."""
  paths = sorted(glob.glob(os.path.join(profile_dir, "**", "*.trace.json.gz"), recursive=True))
  if not paths:
    return []
  with gzip.open(paths[-1], "rt") as f:
    return json.load(f).get("traceEvents", [])


def trace_split(profile_dir: str) -> dict[str, float]:
  events = trace_events(profile_dir)
  return time_split(events) if events else {}


def table_row(device_kind: str, jax_version: str, date: str, rows: list[dict]) -> str:
  """The docs/gpus.md results row of a run: the fastest unpacked and the packed row of each
  family, the peer, decode at batch 1 and 8 (with the share of the HBM floor); "-" where absent."""
  def get(pred, fmt):
    found = [r for r in rows if pred(r)]
    return fmt(min(found, key=lambda r: r["step_ms"])) if found else "-"
  train = lambda fam, packed: lambda r: (  # noqa: E731
      r.get("family") == fam and r.get("packed") is packed and r.get("attention") != "reference"
      and not r.get("moe") and "step_ms" in r and not r["row"].startswith("peer"))
  tok = lambda r: f"{r['tokens_s'] / 1e3:.0f}k"  # noqa: E731
  mfu = lambda r: f"{100 * r['mfu']:.0f} % / {tok(r)}"  # noqa: E731
  dec = lambda r: f"{r['step_ms']:.2f} ({100 * r['of_floor']:.0f} %)"  # noqa: E731
  cells = [device_kind, jax_version, date,
           f"{get(train('decllm', False), mfu)}, {get(train('decllm', True), mfu)}",
           f"{get(train('redllm', False), tok)}, {get(train('redllm', True), tok)}",
           get(lambda r: r["row"].startswith("peer"), tok),
           " / ".join(get(lambda r, b=b: r["row"].endswith(f"decode batch {b}")
                          and r["row"].startswith(fam), dec)
                      for fam in ("decllm", "redllm") for b in (1, 8))]
  return "| " + " | ".join(cells) + " |"



SUMMARY_KEYS = ("row", "variant", "step_ms", "ms", "tokens_s", "mfu", "of_floor", "floor_ms",
                "hlo_kernels", "hlo_launches", "trace_kernels", "busy_share", "tflops_s",
                "temp_gib", "peak_gib", "compile_s", "error")


def summary(paths: list[str]) -> str:
  """A markdown table of the rows of the JSON files a session wrote (``--json`` of the
  benchmarks and of ``gpu_flags.py``), each with its file, card, JAX version and date."""
  paths = [q for p in paths for q in (sorted(glob.glob(os.path.join(p, "*.json")))
                                      if os.path.isdir(p) else [p])]
  lines = ["| file | card | JAX | date | " + " | ".join(SUMMARY_KEYS) + " |",
           "|" + " --- |" * (len(SUMMARY_KEYS) + 4)]
  for path in paths:
    with open(path) as f:
      saved = json.load(f)
    for r in saved.get("rows", []):
      cells = [os.path.basename(path), str(r.get("device", saved.get("device", ""))),
               str(r.get("jax", saved.get("jax", ""))), str(r.get("date", saved.get("date", "")))]
      for k in SUMMARY_KEYS:
        v = r.get(k, "")
        cells.append(f"{v:.4g}" if isinstance(v, float) else str(v).replace("|", "/"))
      lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


if __name__ == "__main__":
  import sys
  print(summary(sys.argv[1:]))
