"""benchmarks/compile_time.py: libtpu's compile log read into stages, and (``make test-aot``) the
benchmark compiling a tiny config and its plain-decoder baseline for a TPU slice."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from benchmarks import compile_time
from train_helpers import REPO, subprocess_env

LOG = """\
I1127 19:53:43.670565 1 hlo_pass_pipeline.cc:176] HLO pass: shardy-xla time: 714 ms (713556 us)
I1127 19:53:43.791499 1 hlo_pass_pipeline.cc:176] HLO pass: xla-partitioner time: 835 ms (834712 us)
I1127 19:53:49.723843 1 deepsea_compiler_hlo_passes.cc:6241] HLO_PASSES stage duration: 7.52260780275s
I1127 20:03:40.970737 1 deepsea_compiler_base.cc:3931] BACKEND_PASSES stage duration: 9m50.15325930525s
I1127 20:03:59.947389 1 deepsea_compiler_backend.cc:1773] final program bundle count: 1,693,838 note
I1127 20:04:02.840566 1 deepsea_compiler_backend.cc:1488] CODE_GENERATION stage duration: 477.2ms
"""


def test_libtpu_log_is_read_into_stages():
  stages = compile_time.libtpu_stages(LOG)
  assert stages == pytest.approx({"hlo_passes": 7.52260780275, "backend_passes": 590.15325930525,
                                  "code_generation": 0.4772, "spmd_partitioning": 0.835,
                                  "bundles": 1693838})
  assert compile_time.libtpu_stages("no libtpu here") == {}


KERNEL_LOG = """\
I1128 15:13:46.200000   7 deepsea_compiler_backend.cc:3769] [<no-hlo-instruction>] LLO optimizing 34,736 instructions
I1128 15:13:46.300000   8 deepsea_compiler_backend.cc:3769] [all-reduce.149] LLO optimizing 152,147 instructions
I1128 15:13:46.400000   9 deepsea_compiler_backend.cc:3769] [fusion.227] LLO optimizing 856 instructions
I1128 15:13:46.500000   9 deepsea_compiler_backend.cc:2846] post-bundle-packing non-empty bundle count: 121
I1128 15:13:46.500100   9 deepsea_compiler_backend.cc:3769] [all-reduce.23.clone] LLO optimizing 10 instructions
I1128 15:13:47.800000   8 deepsea_compiler_backend.cc:2846] post-bundle-packing non-empty bundle count: 31,993
I1128 15:13:48.000100   9 deepsea_compiler_backend.cc:2846] post-bundle-packing non-empty bundle count: 7
I1128 15:14:12.791584   7 deepsea_compiler_backend.cc:2846] post-bundle-packing non-empty bundle count: 22,968
"""


def test_backend_kernels_are_timed_per_thread_and_added_up_by_kind():
  kinds = compile_time.libtpu_kernels(KERNEL_LOG)
  assert list(kinds) == ["all-reduce", "fusion"]  # Largest first; the program itself left out.
  assert kinds["all-reduce"]["seconds"] == pytest.approx(1.5 + 1.5)  # Interleaved threads.
  assert kinds["all-reduce"]["kernels"] == 2 and kinds["all-reduce"]["bundles"] == 32000
  assert kinds["fusion"] == pytest.approx({"seconds": 0.1, "kernels": 1, "bundles": 121})
  line = compile_time.kernel_summary(kinds, 1)
  assert line.startswith("backend kernels: 3.1 thread-s, collectives 97 %; all-reduce 3.0 s")
  assert "fusion" not in line and compile_time.libtpu_kernels(LOG) == {}


def test_fd2_capture_sees_what_cpp_writes_and_restores_stderr():
  with compile_time.captured_fd2() as log:
    os.write(2, b"written to fd 2\n")
  assert log["text"] == "written to fd 2\n"
  os.write(2, b"")  # fd 2 is usable again.


@pytest.mark.parametrize("message, hint", [
    ("RESOURCE_EXHAUSTED: the total memory required for HLO temporaries (103.36G) exceeds", True),
    ("INTERNAL: RET_CHECK failure (hlo_instruction.cc:390) async-update instruction", False)])
def test_a_refused_compile_is_one_row_with_the_memory_hint_only_for_memory(
    monkeypatch, capsys, message, hint):
  import jax

  def refuse(*args, **kwargs):
    raise jax.errors.JaxRuntimeError(message)

  monkeypatch.setattr(compile_time, "measure", refuse)
  assert compile_time.main([os.path.join(REPO, "configs", "tiny_decllm.py")]) == 0
  row = capsys.readouterr().out.strip().splitlines()[-1]
  assert row.startswith("| tiny_decllm | train | does not compile: " + message[:20])
  assert ("microbatches=N" in row) == hint


@pytest.mark.aot
def test_benchmark_splits_a_tpu_compile_and_compiles_the_baseline():
  proc = subprocess.run(
      [sys.executable, os.path.join(REPO, "benchmarks", "compile_time.py"), "--topology",
       "v5e-4", "--baseline", "--kernels", "3", os.path.join(REPO, "configs", "tiny_decllm.py")],
      cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = [line.split("|") for line in proc.stdout.splitlines() if line.startswith("| tiny")]
  assert [r[1].strip() for r in rows] == ["tiny_decllm", "tiny_decllm: plain decoder"], proc.stdout
  for r in rows:  # HLO passes (SPMD) / backend / code gen, and a bundle count, from libtpu;
    hlo, backend, codegen = r[7].split("/")  # the temporaries and XLA's bytes accessed.
    assert float(backend) > 0 and int(r[8].replace(",", "")) > 0, proc.stdout
    assert float(r[11]) >= 0 and float(r[12].split("/")[0]) > 0, proc.stdout
  assert float(rows[0][11]) > 0, proc.stdout  # The trainer's step has temporaries.
  kernels = [line for line in proc.stdout.splitlines() if "backend kernels:" in line]
  assert len(kernels) == 2 and all("fusion" in line for line in kernels), proc.stdout
