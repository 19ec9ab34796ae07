"""Ahead-of-time compilation (``t5like/training/aot.py``): the compile-only report on the local
CPU devices, the memory check that stops a run before its first step, and — with libtpu
(``make test-aot``) — compiles for TPU topologies that do not exist here."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import jax
import pytest

import t5like.training

from cli_scripts import load_script
from t5like.config import ConfigError
from t5like.training import aot, flops, run
from t5like.training.data import SyntheticData
from train_helpers import REPO, subprocess_env, tiny_config


@pytest.mark.parametrize("name, topology", [
    ("v5p-128", "v5p:4x4x4"), ("v5p-8", "v5p:2x2x1"), ("v5p-256", "v5p:4x4x8"),
    ("v5e-256", "v5e:16x16"), ("v6e-64", "v6e:8x8"), ("v4-32", "v4:2x2x4"),
    ("v5p:2x2x2", "v5p:2x2x2")])
def test_slice_names_map_to_topologies(name, topology):
  assert aot.parse_topology(name)[1] == topology


@pytest.mark.parametrize("bad", ["v9-8", "v5p-6", "v5e-12", "tpu"])
def test_bad_slice_names_are_clear_errors(bad):
  with pytest.raises(ConfigError, match="v5p|slice"):
    aot.parse_topology(bad)


def test_local_report_counts_flops_and_microbatches_shrink_temporaries():
  cfg = tiny_config("decllm", batch_size=32, length=64)
  cfg.model.vocab_size = 4096  # Logits dominate the temporaries.
  one = aot.compile_report(cfg, eval_step=False)
  cfg.train.microbatches = 4
  four = aot.compile_report(cfg, eval_step=False)
  assert one["fits"] and one["hbm_bytes"] > 0
  assert one["flops_per_chip"] == flops.train_flops(cfg.model, 32, 64, 0)
  assert four["train"]["temporaries"] < 0.6 * one["train"]["temporaries"]
  assert one["largest_consumer"][0].startswith("logits")


def test_a_step_that_cannot_fit_stops_before_it_runs(tmp_path, monkeypatch, capsys):
  """Through train.py (on synthetic data): the fit check's message as one error block."""
  config = tmp_path / "too_big.py"
  config.write_text(
      "from train_helpers import tiny_config\n\n\ndef get_config():\n"
      "  cfg = tiny_config('decllm', steps=2, batch_size=64, length=1024)\n"
      "  cfg.model.vocab_size = 1 << 17  # [64, 1024, 131072] f32 logits: 32 GiB each.\n"
      "  return cfg\n")
  monkeypatch.setattr(t5like.training, "run",
                      lambda cfg, workdir: run(cfg, workdir, data=SyntheticData(cfg)))
  code = load_script("train.py").main(["--config", str(config), "--workdir",
                                       str(tmp_path / "run")])
  err = capsys.readouterr().err  # The run's log lines, then the error block.
  assert code == 2 and "\nerror: the train step needs " in "\n" + err and "Traceback" not in err
  assert re.search(r"GiB per device.*Largest consumer \(estimate\): logits", err)
  assert not (tmp_path / "run" / "checkpoints").exists() or not os.listdir(
      tmp_path / "run" / "checkpoints")


def test_train_py_compile_only_prints_the_report_and_writes_nothing_else(tmp_path, monkeypatch,
                                                                   capsys):
  monkeypatch.chdir(tmp_path)
  code = load_script("train.py").main(["--config", os.path.join(REPO, "configs", "tiny_redllm.py"),
                         "--compile_only", "--config.train.compile_cache=false"])
  out = capsys.readouterr().out
  assert code == 0, out
  assert "train step per chip" in out and "eval step per chip" in out
  assert "FLOPs per chip per step" in out
  assert os.listdir(tmp_path) == []


@pytest.mark.aot
def test_tpu_topology_reports_hbm_and_a_config_that_does_not_fit():
  cfg = tiny_config("redllm", batch_size=16)
  chip, devices = aot.topology_devices("v5e-4")
  small = aot.compile_report(cfg, devices, chip=chip)
  assert "TPU" in small["device_kind"] and small["devices"] == 4
  assert small["hbm_bytes"] == 16 * aot.GiB and small["fits"]
  assert 0 < small["mfu"] <= 1 and small["step_s"] >= small["compute_s"] > 0

  big = tiny_config("decllm", batch_size=64, length=2048)
  big.model.vocab_size = 1 << 17  # 16 rows per chip x 2048 x 131072 f32 logits: 16 GiB a copy.
  report = aot.compile_report(big, devices, chip=chip, eval_step=False)
  assert not report["fits"] and report["train"]["peak"] > chip.hbm_bytes
  assert "RESOURCE_EXHAUSTED" in report["compile_error"]  # The TPU compiler refused it.
  assert report["largest_consumer"][0].startswith("logits")
  assert "DOES NOT FIT" in aot.format_report("big", report)


@pytest.mark.aot
def test_train_py_compile_only_for_a_tpu_slice(tmp_path):
  proc = subprocess.run(
      [sys.executable, os.path.join(REPO, "train.py"), "--config",
       os.path.join(REPO, "configs", "tiny_decllm_prefix.py"), "--compile_only",
       "--topology", "v5p-8"], cwd=tmp_path, env=subprocess_env(), capture_output=True,
      text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "4 x TPU v5" in proc.stdout and "memory per chip 95.0 GiB: fits" in proc.stdout
  assert "collectives on the SparseCores" in proc.stdout
  assert "roofline" in proc.stdout


def test_collectives_go_to_the_sparsecores_only_on_chips_that_have_them():
  """``partitioning.compiler_options``: libtpu's offload options for v4 / v5p / v6e / TPU7x
  devices while ``mesh.sparsecore_collectives`` is on; nothing for v5e, CPUs, or when off."""
  import types
  import numpy as np
  from t5like import partitioning
  from t5like.config.train import MeshConfig

  def mesh_of(platform, kind):
    device = types.SimpleNamespace(platform=platform, device_kind=kind)
    return types.SimpleNamespace(devices=np.array([device, device], dtype=object))

  on, off = MeshConfig(), MeshConfig(sparsecore_collectives=False)
  for kind in ("TPU v4", "TPU v5", "TPU v6 lite", "TPU7x"):
    opts = partitioning.compiler_options(on, mesh_of("tpu", kind))
    assert opts == partitioning.SPARSECORE_COLLECTIVES, kind
    assert opts["xla_tpu_enable_sparse_core_collective_offload_all_gather"] is True
    assert partitioning.compiler_options(off, mesh_of("tpu", kind)) == {}
  assert partitioning.compiler_options(on, mesh_of("tpu", "TPU v5 lite")) == {}
  assert partitioning.compiler_options(on, mesh_of("cpu", "cpu")) == {}
  assert partitioning.compiler_options(on, partitioning.make_mesh(on)) == {}  # This host's.


def test_lookup_tables_are_gathered_only_on_tpus_without_sparsecores():
  """``partitioning.rules``: the ``lookup`` rule (the embedding table gathered where tokens are
  looked up) for v5e meshes only; the model applies it when the rule is there, and only then."""
  import types
  import numpy as np
  from flax import nnx
  from t5like import partitioning
  from t5like.models import build_model

  def mesh_of(platform, kind):
    device = types.SimpleNamespace(platform=platform, device_kind=kind)
    return types.SimpleNamespace(devices=np.array([device, device], dtype=object))

  def has_lookup(mesh):
    return "lookup" in dict(partitioning.rules(mesh))

  assert has_lookup(mesh_of("tpu", "TPU v5 lite"))
  assert not any(has_lookup(mesh_of("tpu", kind))
                 for kind in ("TPU v4", "TPU v5", "TPU v6 lite", "TPU7x"))
  assert not has_lookup(mesh_of("gpu", "NVIDIA H100")) and not has_lookup(None)

  cfg = tiny_config("decllm")
  model = build_model(cfg.model, nnx.Rngs(0))
  tokens = jax.numpy.zeros((2, 8), jax.numpy.int32)
  mesh = partitioning.make_mesh(cfg.mesh, jax.devices()[:1])

  def constraints(rules):
    with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
      text = str(jax.make_jaxpr(model.embedding.embed)(tokens))
    return text.count("sharding_constraint")

  v5e, v5p = (partitioning.rules(mesh_of("tpu", k)) for k in ("TPU v5 lite", "TPU v5"))
  assert constraints(v5e) == constraints(v5p) + 1


@pytest.mark.aot
def test_v5e_looks_tokens_up_without_an_all_to_all():
  """On a v5e-256 (no SparseCores) the train step gathers the embedding table for the lookup
  instead of moving the looked-up rows by all-to-alls, whose ICI routing libtpu computes alone on
  one thread for seconds each (docs/compile.md); without the ``lookup`` rule, the all-to-alls."""
  from t5like import partitioning
  from t5like.config import load_config
  from t5like.tools.tpu_table import PLACEHOLDERS
  from t5like.training import state as state_lib
  from t5like.training import step as step_lib

  cfg = load_config(os.path.join(REPO, "configs", "decllm_150m.py"),
                    PLACEHOLDERS + ["model.remat_policy=dots_no_batch"])
  mesh = partitioning.make_mesh(cfg.mesh, aot.topology_devices("v5e-256")[1])
  setup = state_lib.build_setup(cfg, mesh)
  batch = aot.abstract_batch(cfg, setup.batch_sharding, cfg.train.batch_size)

  def all_to_alls(rules_mesh):  # A fresh jit each: its trace cache does not see the rules.
    step = step_lib.make_train_step(setup).fn
    with jax.set_mesh(mesh), partitioning.axis_rules(rules_mesh):
      return step.lower(setup.abstract_state, batch).compile().as_text().count("all-to-all(")

  assert all_to_alls(mesh) == 0
  assert all_to_alls(None) > 0


@pytest.mark.aot
def test_v5p_train_step_runs_its_collectives_on_the_sparsecores():
  """The compiled train step of a v5p slice hands its collectives to the SparseCores (libtpu
  marks them ``async_execution_thread="sparsecore"``); with ``mesh.sparsecore_collectives=false``,
  and on v5e (no SparseCores), none is. The eval step compiles with the same options."""
  from t5like import partitioning
  from t5like.training import state as state_lib
  from t5like.training import step as step_lib

  def offloaded(topology, on):
    cfg = tiny_config("decllm", batch_size=16)
    cfg.mesh.sparsecore_collectives = on
    mesh = partitioning.make_mesh(cfg.mesh, aot.topology_devices(topology)[1])
    setup = state_lib.build_setup(cfg, mesh)
    batch = aot.abstract_batch(cfg, setup.batch_sharding, 16)
    with jax.set_mesh(mesh), partitioning.axis_rules():
      train = step_lib.make_train_step(setup).lower(setup.abstract_state, batch).compile()
      step_lib.make_eval_step(setup).lower(setup.abstract_state.params, batch).compile()
    return train.as_text().count('async_execution_thread="sparsecore"')

  assert offloaded("v5p-8", True) > 0
  assert offloaded("v5p-8", False) == 0
  assert offloaded("v5e-4", True) == 0


@pytest.mark.aot
def test_splash_kernel_compiles_for_tpu_and_does_not_hold_the_score_matrices():
  """At length 2048 the reference core keeps [batch, heads, 2048, 2048] scores for the backward pass;
  the splash kernel (real Mosaic kernel here, not interpret mode) keeps O(length)."""
  chip, devices = aot.topology_devices("v5e-4")
  temps = {}
  for impl in ("reference", "splash"):
    cfg = tiny_config("decllm", prefix=True, batch_size=8, length=2048)
    cfg.model.attention_impl = impl
    temps[impl] = aot.compile_report(cfg, devices, chip=chip, eval_step=False)["train"][
        "temporaries"]
  assert temps["splash"] < 0.6 * temps["reference"], temps


def test_a_step_the_accelerator_compiler_refuses_is_a_clear_error():
  """On a TPU the compiler itself refuses a step whose temporaries exceed HBM; that refusal is
  read (bytes needed) and turned into the same error as the memory check."""
  from t5like import partitioning
  from t5like.training import state as state_lib
  cfg = tiny_config("decllm")
  setup = state_lib.build_setup(cfg, partitioning.make_mesh(cfg.mesh))

  class Refused:
    def compile(self):
      raise jax.errors.JaxRuntimeError(
          "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
          "temporaries (103.36G) exceeds available HBM (95.74G).")

  with pytest.raises(ConfigError, match=r"needs 103\.3\d GiB per device.*temporaries 103\.36 GiB"
                                        r".*Largest consumer"):
    aot.compile_checked(cfg, setup, Refused())

  class OutOfHbm:  # libtpu's other wording (a v5e-256 MoE step): the program's whole use.
    def compile(self):
      raise jax.errors.JaxRuntimeError(
          "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: XLA:TPU compile permanent error. Ran "
          "out of memory in memory space hbm. Used 16.13G of 15.75G hbm. Exceeded hbm capacity "
          "by 392.48M.")

  with pytest.raises(ConfigError, match=r"needs 16\.13 GiB per device.*Largest consumer"):
    aot.compile_checked(cfg, setup, OutOfHbm())

  class Broken:
    def compile(self):
      raise jax.errors.JaxRuntimeError("INTERNAL: something else")

  with pytest.raises(jax.errors.JaxRuntimeError, match="something else"):
    aot.compile_checked(cfg, setup, Broken())


def _result(peak_gib: float, microbatches: int = 1) -> dict:
  """A stored tpu_table result with the fields the table prints."""
  return {"mesh": {"data": 1, "fsdp": 64, "tensor": 1}, "num_params": 1.5e8,
          "microbatches": microbatches, "remat": "full",
          "train": {"peak": peak_gib * aot.GiB, "temporaries": peak_gib * aot.GiB},
          "hbm_bytes": 95 * aot.GiB, "fits": True, "headroom": 1 - peak_gib / 95,
          "step_s": 0.1, "step_serial_s": 0.2, "mfu": 0.9, "mfu_serial": 0.7, "compile_s": 10}


def test_tpu_table_merges_new_results_into_the_rows_already_written():
  """``--readme`` keeps the block's rows it has no result for, replaces the ones it has, and
  orders rows as the paper configs, then the slice: one more slice is one more run."""
  from t5like.tools import tpu_table
  old = tpu_table.table({"redllm_150m@v5p-128": _result(40.0),
                         "decllm_150m_flan@v5p-128": _result(30.0)})
  new = tpu_table.table({"decllm_150m_flan@v5e-256": _result(12.0, microbatches=4),
                         "redllm_150m@v5p-128": _result(20.0)}, block=old)
  lines = [ln for ln in new.splitlines() if ln.startswith("| ") and "config" not in ln]
  assert [ln.split("|")[1].strip() + "@" + ln.split("|")[2].strip() for ln in lines] == [
      "redllm_150m@v5p-128", "decllm_150m_flan@v5e-256", "decllm_150m_flan@v5p-128"]
  assert "20.0 / 95" in lines[0] and "40.0" not in new  # Replaced by the new result.
  assert "| 4 |" in lines[1] and "30.0 / 95" in lines[2]  # Added; kept.


def test_tpu_table_renders_every_slice_its_results_hold(tmp_path):
  """Without ``--topologies`` a render shows each row of ``--results``, multi-slice ones too (a
  render that dropped a run's 2xv5p-128 rows left a page describing rows it did not hold);
  ``--topologies`` narrows it."""
  from t5like.tools import tpu_table
  results = tmp_path / "r.json"
  results.write_text(json.dumps({"decllm_8b@2xv5p-128": dict(_result(61.0, 2),
                                                              largest_consumer=["x", 1, "y"]),
                                 "decllm_8b@v5p-128": dict(_result(50.0, 4),
                                                           largest_consumer=["x", 1, "y"])}))
  page = tmp_path / "pods.md"
  for topologies, shown in (([], ["2xv5p-128", "v5p-128"]), (["v5p-128"], ["v5p-128"])):
    page.write_text(f"{tpu_table.BEGIN}\n{tpu_table.END}\n")
    argv = ["--report_only", "--results", str(results), "--readme", str(page)]
    assert tpu_table.main(argv + (["--topologies"] + topologies if topologies else [])) == 0
    assert sorted(tpu_table.block_rows(tpu_table._block(page.read_text()))[0]) == [  # pylint: disable=protected-access
        f"decllm_8b@{t}" for t in shown]


def test_tpu_table_before_sets_this_runs_rows_beside_the_old_ones():
  """``--before PAGE``: a second table of the rows this run compiled beside PAGE's same rows
  (setting, peak, step, headroom before and now), kept as it was by a run without it; the main
  table's rows stay the merge of both."""
  from t5like.tools import tpu_table
  old = tpu_table.table({"redllm_150m@v5p-128": dict(_result(40.0, 2), step_s=0.3),
                         "decllm_150m@v5p-128": _result(30.0)})
  page = f"{tpu_table.BEGIN}\n{old}\n{tpu_table.END}\n"
  new = tpu_table.table({"redllm_150m@v5p-128": _result(20.0),
                         "decllm_1b@v5p-128": _result(50.0)}, block=old, before=page)
  main, compared = new.split(tpu_table.COMPARED)
  assert "20.0 / 95" in main and "30.0 / 95" in main and "50.0 / 95" in main
  rows = [ln for ln in compared.splitlines() if ln.startswith("| ") and "config" not in ln]
  assert rows == ["| redllm_150m | v5p-128 | full/2 → full/1 | 40.0 → 20.0 | 0.30-0.20 → "
                  "0.10-0.20 | 58% → 79% |"]  # decllm_1b had no row before: none here.
  again = tpu_table.table({"decllm_150m@v5p-128": _result(25.0)}, block=new)
  assert again.split(tpu_table.COMPARED)[1] == compared and "25.0 / 95" in again
  assert tpu_table.block_rows(again)[0].keys() == {
      "redllm_150m@v5p-128", "decllm_150m@v5p-128", "decllm_1b@v5p-128"}
  # A later --before run adds its rows to the before/now table, keeps the ones it did not
  # compile and replaces the ones it did.
  def compared_rows(text):
    return [ln for ln in text.split(tpu_table.COMPARED)[1].splitlines()
            if ln.startswith("| ") and "config" not in ln]
  later = tpu_table.table({"decllm_150m@v5p-128": _result(25.0)}, block=again, before=page)
  rows = compared_rows(later)
  assert [r.split("|")[1].strip() for r in rows] == ["decllm_150m", "redllm_150m"]
  assert "30.0 → 25.0" in rows[0] and "40.0 → 20.0" in rows[1]
  last = tpu_table.table({"redllm_150m@v5p-128": _result(10.0)}, block=later, before=page)
  assert compared_rows(last) == [rows[0], rows[1].replace("→ 20.0", "→ 10.0").replace(
      "→ 79%", "→ 89%")]


def test_tpu_table_candidates_are_parsed_and_bad_ones_named():
  """``--candidates full/2 dots_no_batch/1`` restricts the search, in that order."""
  from t5like.tools import tpu_table
  assert [tpu_table._parse_candidate(c) for c in ("full/2", "dots_no_batch/1")] == [  # pylint: disable=protected-access
      ("full", 2), ("dots_no_batch", 1)]
  for bad in ("full", "full/0", "nothing/2", "full/x"):
    with pytest.raises(SystemExit, match="REMAT/MICROBATCHES"):
      tpu_table._parse_candidate(bad)  # pylint: disable=protected-access


def test_tpu_table_from_table_reads_each_rows_setting():
  """``--from_table`` recompiles each row at the setting the page shows: the main table's
  (remat, microbatches) per ``config@slice``, never the before/now table's rows."""
  from t5like.tools import tpu_table
  block = tpu_table.table({"decllm_1b@v5p-128": _result(20.0, 2),
                           "redllm_150m@v5e-256": dict(_result(9.0, 1), remat="dots_no_batch")})
  before = f"{tpu_table.BEGIN}\n{tpu_table.table({'decllm_1b@v5p-128': _result(9.0, 8)})}\n"
  block = tpu_table.table({"decllm_1b@v5p-128": _result(20.0, 2)}, block, before + tpu_table.END)
  assert "full/8 → full/2" in block.split(tpu_table.COMPARED)[1]
  page = f"intro\n{tpu_table.BEGIN}\n{block}\n{tpu_table.END}\nrest"
  assert tpu_table.table_settings(page) == {"decllm_1b@v5p-128": ("full", 2),
                                            "redllm_150m@v5e-256": ("dots_no_batch", 1)}
  assert tpu_table.table_settings("no table here") == {}


def test_tpu_table_from_table_tries_the_shown_setting_first(tmp_path, monkeypatch):
  """``--from_table``: the search of a row starts at the page's setting, then the usual order
  (the search's own, without it again); the page's row is rewritten from this run's result."""
  from t5like.tools import tpu_table
  page = tmp_path / "pods.md"
  block = tpu_table.table({"decllm_1b@v5p-128": _result(20.0, 4)})
  page.write_text(f"{tpu_table.BEGIN}\n{block}\n{tpu_table.END}\n")
  tried = []

  def search(base, chip, devices, log, max_compiles, candidates, first):
    tried.append((first, candidates))
    return dict(_result(33.0, 4), largest_consumer=("x", 1, "y")), base
  monkeypatch.setattr(tpu_table, "search", search)
  monkeypatch.setattr(aot, "topology_devices", lambda topo: (None, []))
  assert tpu_table.main(["--from_table", "--readme", str(page), "--topologies", "v5p-128",
                         "--configs", "decllm_1b", "--results", str(tmp_path / "r.json"),
                         "--in_process"]) == 0
  assert tried == [(("full", 4), None)]  # The shown setting first, then the search's order.
  assert "33.0 / 95" in page.read_text() and "20.0 / 95" not in page.read_text()


def test_tpu_table_survives_a_row_whose_compiler_crashes(tmp_path, monkeypatch, capsys):
  """Each row compiles in a child process: a child killed by a signal (libtpu's compiler has
  crashed so) costs its row, which the page keeps as it was and the end names; the next row's
  child still runs and its result is rendered. The children get the page's setting first."""
  from t5like.tools import tpu_table
  page = tmp_path / "pods.md"
  block = tpu_table.table({"decllm_1b@v5p-128": _result(20.0, 4),
                           "redllm_1b@v5p-128": _result(21.0, 2)})
  page.write_text(f"{tpu_table.BEGIN}\n{block}\n{tpu_table.END}\n")
  results = tmp_path / "r.json"
  stored = dict(_result(33.0, 2), largest_consumer=["x", 1, "y"])
  writes = (f"import json; json.dump({{'redllm_1b@v5p-128': {stored!r}}}, "
            f"open({str(results)!r}, 'w'))")
  calls = []

  def child(args, name, topo, candidates, first):
    calls.append((name, first))
    if name == "decllm_1b":
      return [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]
    return [sys.executable, "-c", writes]
  monkeypatch.setattr(tpu_table, "child_command", child)
  assert tpu_table.main(["--from_table", "--readme", str(page), "--topologies", "v5p-128",
                         "--configs", "decllm_1b", "redllm_1b", "--results", str(results)]) == 1
  assert calls == [("decllm_1b", ("full", 4)), ("redllm_1b", ("full", 2))]
  text = page.read_text()
  assert "20.0 / 95" in text and "33.0 / 95" in text and "21.0 / 95" not in text
  err = capsys.readouterr()
  assert "decllm_1b@v5p-128: its compile process was killed by signal 11" in err.out
  assert "not compiled (their rows are kept as they were): decllm_1b@v5p-128" in err.err


def test_tpu_table_child_command_compiles_one_row_in_process(tmp_path):
  """The child is this tool on one config and slice, in process, with the row's settings; its
  flags are ones the tool parses."""
  from t5like.tools import tpu_table
  results = str(tmp_path / "r.json")
  args = tpu_table.argparse.Namespace(results=results, max_compiles=3)
  cmd = tpu_table.child_command(args, "decllm_1b", "v5p-128", [("full", 4), ("full", 8)],
                                ("dots_no_batch", 2))
  assert cmd[1:] == ["-m", "t5like.tools.tpu_table", "--in_process", "--topologies", "v5p-128",
                     "--configs", "decllm_1b", "--results", results, "--max_compiles", "3",
                     "--candidates", "full/4", "full/8", "--first", "dots_no_batch/2"]
  assert tpu_table.main(cmd[3:] + ["--report_only"]) == 0


def test_tpu_table_compiles_moe_configs_expert_parallel():
  """An MoE paper config is compiled on its expert-parallel setting (an 8-way expert axis, the
  capacity path), a dense one as it is; MoE rows follow the dense tables' rows."""
  from t5like.tools import tpu_table
  moe = tpu_table._load(os.path.join(REPO, "configs", "redllm_1b_moe.py"))  # pylint: disable=protected-access
  assert moe.mesh.expert == 8 and moe.model.moe.capacity_factor > 0
  assert moe.model.moe.num_experts % moe.mesh.expert == 0
  dense = tpu_table._load(os.path.join(REPO, "configs", "redllm_1b.py"))  # pylint: disable=protected-access
  assert dense.mesh.expert == 1 and dense.model.moe.num_experts == 0
  stored = dict(_result(20.0), mesh={"data": 1, "expert": 8, "fsdp": 8, "tensor": 1})
  rows = tpu_table.table({"decllm_1b_moe@v5p-128": stored, "redllm_8b_flan@v5p-128": _result(9.0)})
  names = [ln.split("|")[1].strip() for ln in rows.splitlines()[2:]]
  assert names == ["redllm_8b_flan", "decllm_1b_moe"] and "expert8xfsdp8" in rows
