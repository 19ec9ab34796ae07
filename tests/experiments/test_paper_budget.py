"""``python -m t5like.experiments NAME --scale paper``: beside each run's pod command, per slice of
the TPU table the setting ``train.fit=auto`` takes, the roofline step time and the run's
chip-hours, then the study's total per slice; from the table's rows (a page's block, a results
file), a row that does not fit never taken, a run whose overrides change the compiled step sent
to ``--compile_only`` instead."""
from __future__ import annotations

import json
import os
import re

import pytest

from t5like.config import load_config
from t5like.experiments.__main__ import main
from t5like.experiments.runner import configs_dir

HEADER = ("| config | slice | params | mesh | micro-batches | remat | peak / HBM GiB per chip | "
          "headroom | step s | roofline MFU | compile s | compiled (date, host, code) |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|\n")


def _page(tmp_path, rows: list[str]) -> str:
  path = tmp_path / "pods.md"
  path.write_text("# Pods\n\n<!-- tpu-table -->\n" + HEADER + "\n".join(rows)
                  + "\n<!-- /tpu-table -->\nmore text\n")
  return str(path)


def _paper(capsys, *argv: str) -> list[str]:
  assert main([*argv, "--scale", "paper"]) == 0
  return capsys.readouterr().out.splitlines()


def _steps(config: str) -> int:
  return load_config(os.path.join(configs_dir(), config),
                     ["data.data_dir=gs://b/c", "data.vocab_path=gs://b/v"]).train.steps


def _chip_hours(line: str) -> tuple[float, float]:
  lo, hi = re.search(r"([\d,.]+)-([\d,.]+) chip-hours", line).groups()
  return float(lo.replace(",", "")), float(hi.replace(",", ""))


def test_each_run_gets_its_slices_setting_step_and_chip_hours(tmp_path, capsys):
  page = _page(tmp_path, [
      "| decllm_150m | v5p-128 | 0.17B | fsdp64 | 2 | full | 30.0 / 95 | 69% | 0.10-0.20 | "
      "86%-100% | 25 | — |",
      "| decllm_150m | v5e-256 | 0.17B | fsdp256 | 1 | dots_no_batch | 15.0 / 16 | **no** (6%) | "
      "0.05-0.06 | 76%-100% | 23 | — |",
      "| redllm_150m | v5p-128 | 0.15B | fsdp64 | 1 | dots_no_batch | 17.9 / 95 | 81% | 0.90-1.00 "
      "| 82%-100% | 30 | — |"])
  results = tmp_path / "results.json"  # A later source's row replaces the page's.
  results.write_text(json.dumps({"redllm_150m@v5p-128": {
      "fits": True, "remat": "full", "microbatches": 4, "step_s": 0.05, "step_serial_s": 0.07,
      "mesh": {"dcn": 1, "data": 1, "expert": 1, "fsdp": 64, "tensor": 1}}}))
  out = _paper(capsys, "length_extrapolation", "--tpu_table", page, str(results))
  train = [i for i, line in enumerate(out) if line.startswith("python train.py")]
  assert len(train) == 2
  dec, red = out[train[0] + 1], out[train[1] + 1]
  assert "decllm_150m.py" in out[train[0]] and "redllm_150m.py" in out[train[1]]
  assert dec.startswith("#   v5p-128 (64 chips): train.fit=auto takes model.remat_policy=full "
                        "train.microbatches=2 (mesh fsdp64); roofline step 0.10-0.20 s")
  assert not out[train[0] + 2].startswith("#   v5e-256")  # That row does not fit: never taken.
  steps = _steps("decllm_150m.py")
  assert _chip_hours(dec) == pytest.approx((steps * 0.1 / 3600 * 64, steps * 0.2 / 3600 * 64),
                                           rel=1e-3, abs=0.6)
  assert "model.remat_policy=full train.microbatches=4" in red  # The results file's row.
  total = [line for line in out if line.startswith("# length_extrapolation on v5p-128:")]
  assert len(total) == 1 and not any("on v5e-256" in line for line in out)
  want = [a + b for a, b in zip(_chip_hours(dec), _chip_hours(red))]
  assert _chip_hours(total[0]) == pytest.approx(want, rel=1e-3, abs=1)


def test_a_run_off_the_table_gets_the_command_for_its_figures(tmp_path, capsys):
  """redllm_150m with model.mixed_attention=per_head is not the table's compiled step; a config
  with no fitting row names the table command."""
  page = _page(tmp_path, [
      "| redllm_150m | v5p-128 | 0.15B | fsdp64 | 1 | dots_no_batch | 17.9 / 95 | 81% | "
      "0.07-0.08 | 82%-100% | 30 | — |"])
  out = _paper(capsys, "mixed_attention", "moe", "--tpu_table", page)
  per_head = out.index(next(line for line in out if "redllm_per_head" in line
                            and line.startswith("python train.py")))
  assert out[per_head + 1].startswith("#   its overrides change redllm_150m's compiled step")
  assert out[per_head + 1].endswith("--config.model.mixed_attention=per_head "
                                    "--config.data.vocab_path=gs://YOUR_BUCKET/vocab/spm32k.model "
                                    "--config.data.validation_holdout=0.001 --compile_only "
                                    "--topology v5p-128")
  assert any(line.startswith("#   no TPU table row fits for decllm_1b_moe: make tpu-table")
             for line in out)


def test_the_shipped_table_prices_every_scaling_run_on_both_slices(capsys):
  """docs/pods.md (the default source) has a fitting row of every paper pretraining config on
  v5e-256 and v5p-128, and of the 8B ones on several slices; a slice's total says how many of
  the study's runs it counts."""
  out = _paper(capsys, "scaling", "--tpu_table", os.path.join(
      os.path.dirname(configs_dir()), "docs", "pods.md"))
  train = [i for i, line in enumerate(out) if line.startswith("python train.py")]
  assert len(train) == 10
  for i in train:
    slices = []
    for line in out[i + 1:]:
      if not line.startswith("#   "):
        break
      slices.append(line.split(" ")[3])
    expected = ["v5e-256", "v5p-128"]
    if "_8b.py" in out[i]:
      expected = ["2xv5p-128", "4xv5e-256"] + expected
    assert slices == expected, out[i]
  totals = {line.split(" ")[3].rstrip(":"): line for line in out if line.startswith("# scaling on ")}
  assert sorted(totals) == ["2xv5p-128", "4xv5e-256", "v5e-256", "v5p-128"]
  assert totals["v5p-128"].endswith(" 10 runs' training steps")
  assert totals["2xv5p-128"].endswith("training steps of 2 of its 10 runs (the others have no "
                                      "table row there)")


def test_a_named_table_that_does_not_exist_is_a_clear_error(tmp_path, capsys):
  missing = str(tmp_path / "nope.md")
  assert main(["mixed_attention", "--scale", "paper", "--tpu_table", missing]) == 2
  err = capsys.readouterr().err
  assert f"--tpu_table: no such file: {missing}" in err and "Traceback" not in err
