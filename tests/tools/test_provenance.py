"""t5like.tools.provenance: the stamp the TPU table puts on each row it compiles."""
from __future__ import annotations

import re
import subprocess

from t5like.tools import provenance, tpu_table
from t5like.training import aot


def test_host_name_is_the_cpu_model_without_trademarks_and_speeds():
  assert provenance.host_name("model name\t: Intel(R) Xeon(R) Processor\n") == "Intel Xeon"
  assert provenance.host_name(
      "processor\t: 0\nmodel name\t: AMD EPYC 9B14 96-Core Processor\n") == "AMD EPYC 9B14"
  assert provenance.host_name(
      "model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz\n") == "Intel Xeon Platinum 8481C"
  assert provenance.host_name("no model here")  # Falls back to the machine, never empty.


def test_code_version_is_the_commit_and_marks_uncommitted_code(tmp_path):
  def git(*args):
    subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)
  git("init", "-q")
  (tmp_path / "t5like").mkdir()
  (tmp_path / "t5like" / "m.py").write_text("x = 1\n")
  (tmp_path / "notes.md").write_text("a\n")
  git("add", "-A")
  git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
  head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "--short=7", "HEAD"],
                        check=True, capture_output=True, text=True).stdout.strip()
  assert provenance.code_version(str(tmp_path)) == head
  (tmp_path / "notes.md").write_text("b\n")  # Not code: the stamp stays clean.
  assert provenance.code_version(str(tmp_path)) == head
  (tmp_path / "t5like" / "m.py").write_text("x = 2\n")
  assert provenance.code_version(str(tmp_path)) == head + "+"
  assert provenance.code_version(str(tmp_path / "nowhere")) == ""


def test_each_table_row_names_when_where_and_by_which_code_it_was_compiled():
  stamp = provenance.stamp()
  assert re.fullmatch(r"\d{4}-\d\d-\d\d", stamp["date"]) and stamp["cpus"] >= 1
  result = {"mesh": {"fsdp": 64}, "num_params": 1.5e8, "microbatches": 1, "remat": "full",
            "train": {"peak": 20 * aot.GiB}, "hbm_bytes": 95 * aot.GiB, "fits": True,
            "headroom": 0.8, "step_s": 0.1, "step_serial_s": 0.2, "mfu": 0.9, "mfu_serial": 0.7,
            "compile_s": 31.4}
  stamped = dict(result, compiled={"date": "2026-11-29", "host": "Intel Xeon", "cpus": 2,
                                   "code": "40f373d"})
  text = tpu_table.table({"decllm_1b@v5p-128": stamped, "redllm_1b@v5p-128": result})
  header, _, row, old = text.splitlines()
  assert header.endswith("| compile s | compiled (date, host, code) |")
  assert row.endswith("| 31 | 2026-11-29, Intel Xeon (2 CPUs), 40f373d |")
  assert old.endswith("| 31 | — |")  # A result stored before rows were stamped.
  assert len(row.split("|")) == len(header.split("|"))
