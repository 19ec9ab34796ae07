"""benchmarks/compile_time.py: libtpu's compile log read into stages, the plain steps of
``--baseline`` training on CPU, and (``make test-aot``) the benchmark compiling a tiny config and
its plain-decoder baseline for a TPU slice."""
from __future__ import annotations

import collections
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import numpy as np
import optax

from benchmarks import compile_baseline, compile_sources, compile_time
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
  kinds = compile_time.by_kind(compile_time.kernel_times(KERNEL_LOG))
  assert list(kinds) == ["all-reduce", "fusion"]  # Largest first; the program itself left out.
  assert kinds["all-reduce"]["seconds"] == pytest.approx(1.5 + 1.5)  # Interleaved threads.
  assert kinds["all-reduce"]["kernels"] == 2 and kinds["all-reduce"]["bundles"] == 32000
  assert kinds["fusion"] == pytest.approx({"seconds": 0.1, "kernels": 1, "bundles": 121})
  line = compile_time.kernel_summary(kinds, 1)
  assert line.startswith("backend kernels: 3.1 thread-s, collectives 97 %; all-reduce 3.0 s")
  assert "fusion" not in line and compile_time.by_kind(compile_time.kernel_times(LOG)) == {}


def _project(x, w):
  with jax.named_scope("projection_scope"):
    return x @ w  # <- line:project


def _loss(w, x):
  h = _project(x, w)  # <- line:loss-calls-project
  with jax.named_scope("head_scope"):
    return jnp.sum(jnp.sin(h) ** 2)  # <- line:head


def _small_step_hlo() -> str:
  """The optimised HLO text, stack frame tables included, of a tiny gradient on XLA:CPU."""
  step = jax.jit(jax.grad(_loss))
  return step.lower(jnp.ones((4, 8)), jnp.ones((3, 4))).compile().as_text()  # <- line:lower


def _line(marker: str) -> int:
  with open(__file__, encoding="utf-8") as f:
    return next(n for n, text in enumerate(f, 1) if text.rstrip().endswith(f"# <- line:{marker}"))


def _kernel_log(kernels: list[tuple[str, float, int]]) -> str:
  """libtpu's per-kernel lines (``KERNEL_LOG``'s format) for kernels one after another on a
  thread: (name, seconds, bundles)."""
  lines, t = [], 0.0
  for name, seconds, bundles in kernels:
    for at, what in ((t, f"[{name}] LLO optimizing 10 instructions"),
                     (t + seconds, f"post-bundle-packing non-empty bundle count: {bundles:,}")):
      lines.append(f"I1128 15:{int(at // 60):02d}:{at % 60:09.6f}   9 "
                   f"deepsea_compiler_backend.cc:3769] {what}")
    t += seconds + 1.0
  return "\n".join(lines) + "\n"


def test_backend_seconds_land_on_the_source_lines_that_made_the_kernels():
  hlo = _small_step_hlo()
  assert "StackFrames" in hlo and "stack_frame_id=" in hlo
  # Every instruction from one of the two scopes is a kernel of its own seconds. The
  # scope in its op name (not its stack) says which line made it; transpose( says backward.
  ops = re.findall(r'^\s*(?:ROOT )?%?([\w.\-]+) = .*metadata=\{op_name="([^"]*(?:projection|head)'
                   r'_scope[^"]*)"', hlo, re.M)
  assert len({("transpose(" in op, "projection" in op) for _, op in ops}) == 4, ops
  me = os.path.basename(__file__)
  where = {True: f"_project@{me}:{_line('project')} < _loss@{me}:{_line('loss-calls-project')}",
           False: f"_loss@{me}:{_line('head')} < _small_step_hlo@{me}:{_line('lower')}"}
  kernels, expected = [], collections.Counter()
  for i, (name, op) in enumerate(ops):  # One named with libtpu's .clone suffix.
    kernels.append((name + (".clone" if i == 0 else ""), 2.0 ** i, 100 + i))
    expected[f"{'bwd' if 'transpose(' in op else 'fwd'} {where['projection' in op]}"] += 2.0 ** i
  kernels.append(("all-reduce.7", 0.5, 3))  # Not an instruction of this program.
  log = _kernel_log(kernels)
  groups = compile_sources.by_source(compile_time.kernel_times(log), hlo,
                                     inside=__file__, depth=2)
  assert {k: g["seconds"] for k, g in groups.items()} == pytest.approx(
      {**expected, "all-reduce": 0.5}, abs=1e-4)
  assert sum(g["kernels"] for g in groups.values()) == len(kernels)
  assert sum(g["bundles"] for g in groups.values()) == sum(b for _, _, b in kernels)
  # Outside the frames asked for, kernels go by their op: nothing names a line, nothing is lost.
  by_op = compile_sources.by_source(compile_time.kernel_times(log), hlo)
  assert not any("@" in k for k in by_op) and "all-reduce" in by_op
  assert sum(g["seconds"] for g in by_op.values()) == pytest.approx(sum(2.0 ** i for i in range(
      len(ops))) + 0.5, abs=1e-4)
  lines = compile_sources.source_summary(groups, 1)  # The largest, then the rest together.
  assert len(lines) == 3 and list(groups)[0] in lines[1] and "more groups" in lines[2]
  assert sum(float(re.search(r"([\d.]+) s ", line).group(1)) for line in lines[1:]) == (
      pytest.approx(sum(g["seconds"] for g in groups.values()), abs=0.1))


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


@pytest.mark.parametrize("family,moe", [  # One case in make test, the rest slow (docs/tests.md).
    ("decllm", False), pytest.param("redllm", False, marks=pytest.mark.slow),
    pytest.param("decllm", True, marks=pytest.mark.slow), pytest.param("redllm", True, marks=pytest.mark.slow)])
def test_plain_step_is_a_train_step_of_the_configs_shapes(family, moe):
  """The floor ``--baseline`` compiles is a working train step of the config's family and
  shapes: the batch is the config's (tokens, or inputs and targets), the loss falls on a fixed
  batch, and every weight learns (RedLLM's encoder through the cross-attention; with MoE, the
  router, the routed and the shared experts, after a dense first layer in each stack)."""
  from t5like.config import load_config
  cfg = load_config(os.path.join(REPO, "configs", f"tiny_{family}{'_moe' if moe else ''}.py"),
                    ["model.moe.decoder_first_dense=1", "model.moe.encoder_first_dense=1",
                     "model.num_encoder_layers=2", "model.num_decoder_layers=2",
                     "model.moe.capacity_factor=2.0"] if moe else [])
  r = compile_baseline.measure(cfg, jax.devices()[:1])
  params_in, _, batch_in = r["lowered"].args_info[0]
  lengths = ((cfg.data.inputs_length, cfg.data.targets_length) if family == "redllm"
             else (cfg.data.sequence_length,))
  assert [b.shape for b in batch_in] == [(cfg.train.batch_size, n) for n in lengths]
  assert ("encoder" in params_in) == (family == "redllm")
  stack = params_in["decoder" if family == "redllm" else "layers"]
  assert sorted(stack) == (["0_dense", "1_moe"] if moe else ["0_dense"])
  if moe:
    layers = cfg.model.num_layers if family == "decllm" else cfg.model.num_decoder_layers
    assert stack["1_moe"]["expert_wi"].shape == (
        layers - 1, cfg.model.moe.num_experts, cfg.model.d_model, cfg.model.moe.expert_d_ff)
  rng = np.random.default_rng(0)
  params = jax.tree_util.tree_map_with_path(  # RMSNorm gains 1, weights N(0, 0.02).
      lambda path, a: jnp.ones(a.shape) if "norm" in jax.tree_util.keystr(path)
      else jnp.asarray(rng.normal(0, 0.02, a.shape), jnp.float32), params_in)
  first = jax.tree.map(np.asarray, params)
  opt = optax.adafactor(1e-3).init(params)
  batch = tuple(jnp.asarray(rng.integers(0, cfg.model.vocab_size, b.shape), jnp.int32)
                for b in batch_in)
  losses = []
  for _ in range(5):
    params, opt, loss = r["compiled"](params, opt, batch)
    losses.append(float(loss))
  assert losses[-1] < losses[0], losses
  moved = jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != b)), params, first)
  assert all(jax.tree.leaves(moved)), moved


@pytest.mark.slow  # make test's 15-minute budget on 2 cores (docs/tests.md)
def test_baseline_rows_name_each_familys_plain_step(capsys):
  paths = [os.path.join(REPO, "configs", f"tiny_{f}.py") for f in ("decllm", "redllm")]
  assert compile_time.main(["--baseline", *paths]) == 0
  rows = [line.split("|")[1].strip() for line in capsys.readouterr().out.splitlines()
          if line.startswith("| tiny")]
  assert rows == ["tiny_decllm", "tiny_decllm: plain decoder", "tiny_redllm",
                  "tiny_redllm: plain encoder-decoder"]


@pytest.mark.aot
def test_benchmark_splits_a_tpu_compile_and_compiles_the_baseline():
  proc = subprocess.run(
      [sys.executable, os.path.join(REPO, "benchmarks", "compile_time.py"), "--topology",
       "v5e-4", "--baseline", "--kernels", "3", "--by_source", "3",
       os.path.join(REPO, "configs", "tiny_decllm.py")],
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
  # By source: the same kernels' seconds, the largest groups naming the model's own lines (the
  # trainer's under t5like/models/, the plain decoder's in its file).
  sources = [line for line in proc.stdout.splitlines() if "by source (" in line]
  assert [re.search(r"\(([\d.]+) thread-s", line).group(1) for line in sources] == [
      re.search(r"kernels: ([\d.]+) thread-s", line).group(1) for line in kernels], proc.stdout
  trainer, baseline = proc.stdout.split("plain decoder")
  models = re.findall(r"@models/(\w+\.py):\d+", trainer)
  assert models and all(os.path.exists(os.path.join(REPO, "t5like", "models", m))
                        for m in models), proc.stdout
  assert "@compile_baseline.py:" in baseline, proc.stdout
