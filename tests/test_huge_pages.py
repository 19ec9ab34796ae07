"""The CLIs restart once with glibc's huge-page tunable where the kernel gives huge pages only on
request (``t5like.runtime.reexec_with_huge_pages``): same PID and arguments, other tunables
kept, the heap then really backed by huge pages; never twice, and not when opted out."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from t5like import runtime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MADVISE = "always [madvise] never\n"

# Prints its PID and GLIBC_TUNABLES at start (once per start), restarts if due, then fills a
# 64 MiB block from libc's malloc (not numpy's: numpy asks for huge pages itself) and reports
# how much of the process is backed by anonymous huge pages.
PROBE = f"""
import ctypes, os, sys
sys.path.insert(0, {ROOT!r})
print("start", os.getpid(), os.environ.get("GLIBC_TUNABLES", ""), flush=True)
from t5like import runtime
runtime.reexec_with_huge_pages()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
block = libc.malloc(64 << 20)
ctypes.memset(block, 1, 64 << 20)
with open("/proc/self/smaps_rollup") as f:
  huge_kb = [int(l.split()[1]) for l in f if l.startswith("AnonHugePages:")][0]
print("end", os.getpid(), os.environ.get("GLIBC_TUNABLES", ""), sys.argv[1:], huge_kb)
"""


@pytest.mark.parametrize("tunables, glibc, thp, want", [
    ("", (2, 36), MADVISE, "glibc.malloc.hugetlb=1"),
    ("glibc.malloc.check=0", (2, 35), MADVISE, "glibc.malloc.check=0:glibc.malloc.hugetlb=1"),
    ("glibc.malloc.hugetlb=1", (2, 36), MADVISE, None),  # Already restarted: never twice.
    ("glibc.malloc.hugetlb=0", (2, 36), MADVISE, None),  # The user's choice stands.
    ("", (2, 34), MADVISE, None),  # glibc without the tunable.
    ("", None, MADVISE, None),  # Not glibc.
    ("", (2, 36), "[always] madvise never\n", None),  # Huge pages without asking.
    ("", (2, 36), "always madvise [never]\n", None),  # None to be had.
])
def test_when_to_restart(tunables, glibc, thp, want):
  assert runtime.huge_page_tunables(tunables, glibc, thp) == want


def _probe(tmp_path, **env):
  script = tmp_path / "probe.py"
  script.write_text(PROBE)
  base = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "T5LIKE_HUGE_PAGES")}
  proc = subprocess.run([sys.executable, str(script), "--flag", "a b"], env={**base, **env},
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  starts = [line.split(" ", 2) for line in proc.stdout.splitlines() if line.startswith("start")]
  end = [line for line in proc.stdout.splitlines() if line.startswith("end")]
  assert len(end) == 1, proc.stdout
  return starts, end[0]


def _thp() -> str:
  try:
    with open(runtime.THP_ENABLED) as f:
      return f.read()
  except OSError:
    return ""


def test_a_cli_restarts_once_with_huge_pages(tmp_path):
  due = runtime.huge_page_tunables("", runtime._glibc_version(), _thp())
  starts, end = _probe(tmp_path)
  pid = starts[0][1]
  if due is None:  # This host: nothing to gain; the process goes on as it started.
    assert len(starts) == 1
    return
  assert [s[1] for s in starts] == [pid, pid]  # One restart, in place (exec: same PID).
  assert starts[1][2] == due
  assert end.startswith(f"end {pid} {due} ['--flag', 'a b'] ")  # Arguments unchanged.
  assert int(end.rsplit(" ", 1)[1]) > 0  # malloc's block sits on huge pages now.


def test_opting_out_keeps_the_process_and_its_small_pages(tmp_path):
  starts, end = _probe(tmp_path, T5LIKE_HUGE_PAGES="0")
  assert len(starts) == 1 and starts[0][2] == ""
  if "[madvise]" in _thp():  # Without the request the kernel hands out small pages.
    assert int(end.rsplit(" ", 1)[1]) == 0
