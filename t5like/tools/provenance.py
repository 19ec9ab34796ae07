"""Where and with what a measurement was taken: date, host CPU, versions, the code's commit.

Compile seconds depend on the host's CPU type (an AMD EPYC Zen 4 takes ~1.4x an Intel Xeon with
AMX for the same TPU program) and on the code, so the TPU table stamps every row it compiles
(``tpu_table``) and the compile benchmark prints the same host line (``compile_time.py``).
"""
from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_NOISE = re.compile(r"\((?:R|TM|tm|r)\)|\bCPU\b|\bProcessor\b|\b\d+-Core\b|@.*$")


def host_name(cpuinfo: str | None = None) -> str:
  """The CPU model, shortened (``Intel(R) Xeon(R) Processor`` -> ``Intel Xeon``, ``AMD EPYC 9B14
  96-Core Processor`` -> ``AMD EPYC 9B14``); ``platform.machine()`` where the kernel gives none."""
  if cpuinfo is None:
    try:
      with open("/proc/cpuinfo", encoding="utf-8") as f:
        cpuinfo = f.read()
    except OSError:
      cpuinfo = ""
  m = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
  name = " ".join(_NOISE.sub(" ", m.group(1)).split()) if m else ""
  return name or platform.processor() or platform.machine()


def code_version(root: str = ROOT) -> str:
  """The checkout's short commit, with ``+`` when the code (t5like/, configs/) has uncommitted
  changes; "" outside a git checkout."""
  def git(*args: str) -> str:
    return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True,
                          check=True, timeout=30).stdout.strip()
  try:
    commit = git("rev-parse", "--short=7", "HEAD")
    dirty = git("status", "--porcelain", "--", "t5like", "configs")
  except (OSError, subprocess.SubprocessError):
    return ""
  return commit + ("+" if dirty else "")


def _version(package: str) -> str:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return ""


def stamp(root: str = ROOT) -> dict[str, str | int]:
  """This measurement's provenance: UTC date, host CPU and count, jax / libtpu, code commit."""
  return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
          "host": host_name(), "cpus": os.cpu_count() or 0, "jax": _version("jax"),
          "libtpu": _version("libtpu"), "code": code_version(root)}


def cell(p: dict | None) -> str:
  """A table cell for a stamp: ``2026-11-29, Intel Xeon (2 CPUs), 40f373d``; "—" without one."""
  if not p:
    return "—"
  host = f"{p.get('host', '?')} ({p['cpus']} CPUs)" if p.get("cpus") else p.get("host", "?")
  return ", ".join(str(v) for v in (p.get("date"), host, p.get("code")) if v)
