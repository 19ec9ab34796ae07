"""What a study costs at paper scale, printed by ``python -m t5like.experiments NAME --scale paper``
under each run's ``train.py`` command: for every slice the TPU table compiled the run's config
for, the setting ``train.fit=auto`` takes there (remat policy and microbatches; the table's mesh),
the roofline step time and the run's chip-hours (``train.steps`` x step time x the slice's chips),
then the study's total per slice.

The figures are the TPU table's (``make tpu-table``: ahead-of-time compiles of every paper config
for its slices, docs/pods.md), so nothing compiles here: the rows of the table block in
docs/pods.md, updated by the table tool's results file where there is one (``runs/tpu_table.json``,
or ``--tpu_table PATH``: a results JSON or a page with the block). A row whose setting leaves
less than the table's headroom free is not taken. A run whose compiled step is not its config's
(an override of the model, the mesh, the batch or the data's shapes) gets the ``--compile_only``
command that gives its figures instead. Only training steps are counted: compiling, evaluation,
checkpoints and restarts come on top (``python -m t5like.tools.goodput`` says how much on a run).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shlex
from typing import Any

from etils import epath

BEGIN, END = "<!-- tpu-table -->", "<!-- /tpu-table -->"
# Data settings that say where the data is, not what the compiled step sees.
WHERE = {"data_dir", "vocab_path", "validation_holdout", "validation_dir", "tfds_data_dir",
          "cache_dir", "source", "mixture", "eval_mixture"}


@dataclasses.dataclass(frozen=True)
class Row:
  """One ``config@slice`` row of the TPU table that fits."""
  remat: str
  microbatches: int
  mesh: str  # e.g. "fsdp64", "expert8xfsdp8".
  step_s: tuple[float, float]  # The roofline bracket: overlapped .. serial.


def _page_rows(text: str) -> dict[str, Row]:
  """The fitting rows of every table in ``text``'s tpu-table block whose header has the main
  table's columns (the block's other tables are skipped)."""
  if BEGIN not in text or END not in text:
    return {}
  rows, header = {}, None
  for line in text.split(BEGIN, 1)[1].split(END, 1)[0].splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if not line.startswith("|"):
      header = None
    elif cells[0] == "config":
      header = cells
    elif header and {"micro-batches", "remat", "step s", "headroom"} <= set(header) \
        and not cells[0].startswith("-"):
      r = dict(zip(header, cells))
      lo, _, hi = r["step s"].partition("-")
      if not r["headroom"].startswith("**no**"):
        rows[f"{r['config']}@{r['slice']}"] = Row(r["remat"], int(r["micro-batches"]), r["mesh"],
                                                  (float(lo), float(hi or lo)))
  return rows


def _json_rows(text: str) -> dict[str, Row]:
  """The fitting rows of a ``t5like.tools.tpu_table`` results file."""
  out = {}
  for key, r in json.loads(text).items():
    if r.get("fits"):
      mesh = "x".join(f"{k}{v}" for k, v in r["mesh"].items() if v > 1) or "1"
      out[key] = Row(r["remat"], int(r["microbatches"]), mesh,
                     (float(r["step_s"]), float(r["step_serial_s"])))
  return out


def exists(path: str) -> bool:
  return epath.Path(path).exists()


def read_table(paths: list[str]) -> dict[str, Row]:
  """The rows of ``paths`` in order (a later one's rows replace an earlier one's); a path that
  does not exist is skipped."""
  rows: dict[str, Row] = {}
  for path in paths:
    p = epath.Path(path)
    if p.exists():
      text = p.read_text()
      rows.update(_json_rows(text) if path.endswith(".json") else _page_rows(text))
  return rows


def slice_chips(name: str) -> int:
  """Chips of a slice name: ``v5p-128`` 64 (v4/v5p names count TensorCores), ``v5e-256`` 256,
  ``2xv5p-128`` 128 (two slices)."""
  from t5like.training import aot
  many = re.fullmatch(r"([0-9]+)x(v.+)", name)
  count, name = (int(many.group(1)), many.group(2)) if many else (1, name)
  return count * math.prod(int(d) for d in aot.parse_topology(name)[1].split(":")[1].split("x"))


def _shape_fields(cfg) -> tuple[Any, ...]:
  """What the compiled train step depends on (not where the data is or how long it runs)."""
  data = {k: v for k, v in dataclasses.asdict(cfg.data).items() if k not in WHERE}
  return cfg.model, cfg.mesh, cfg.train.batch_size, cfg.train.microbatches, data


def _hours(x: float) -> str:
  return f"{x:,.0f}" if x >= 10 else f"{x:.2g}"


def _where(override: str) -> bool:
  """An override the table's compile takes too (data locations, the run to start from)."""
  key = override.split("=", 1)[0]
  return key == "train.init_from" or (key.startswith("data.") and key[5:] in WHERE)


def run_lines(path: str, overrides: list[str], rows: dict[str, Row],
              totals: dict[str, list[float]], command: list[str]) -> list[str]:
  """The cost lines of one run: the config file ``path`` with ``overrides``, started by
  ``command``; adds its chip-hours to ``totals[slice]``."""
  from t5like.config import load_config
  name = os.path.basename(path).removesuffix(".py")
  cfg = load_config(path, overrides)
  base = load_config(path, [o for o in overrides if _where(o)])  # What the table compiled.
  slices = sorted(k.split("@", 1)[1] for k in rows if k.split("@", 1)[0] == name)
  if not slices:
    return [f"#   no TPU table row fits for {name}: make tpu-table TABLE_ARGS=\"--configs {name}\""]
  if _shape_fields(cfg) != _shape_fields(base):
    topo = slices[0]
    return [f"#   its overrides change {name}'s compiled step: its figures on {topo}: "
            + shlex.join(command + ["--compile_only", "--topology", topo])]
  lines = []
  for topo in slices:
    r, chips = rows[f"{name}@{topo}"], slice_chips(topo)
    wall = [cfg.train.steps * s / 3600 for s in r.step_s]
    chip_hours = [h * chips for h in wall]
    total = totals.setdefault(topo, [0.0, 0.0, 0])
    total[0], total[1], total[2] = total[0] + chip_hours[0], total[1] + chip_hours[1], total[2] + 1
    lines.append(
        f"#   {topo} ({chips} chips): train.fit=auto takes model.remat_policy={r.remat} "
        f"train.microbatches={r.microbatches} (mesh {r.mesh}); roofline step "
        f"{r.step_s[0]:.2f}-{r.step_s[1]:.2f} s x {cfg.train.steps:,} steps = "
        f"{_hours(wall[0])}-{_hours(wall[1])} h, {_hours(chip_hours[0])}-"
        f"{_hours(chip_hours[1])} chip-hours")
  return lines


def total_lines(name: str, runs: int, totals: dict[str, list[float]]) -> list[str]:
  """The study's chip-hours per slice (its runs with a row there, one after another)."""
  lines = []
  for topo, (lo, hi, priced) in sorted(totals.items()):
    chips = slice_chips(topo)
    which = (f"{runs} runs' training steps" if priced == runs else
             f"training steps of {priced} of its {runs} runs (the others have no table row there)")
    lines.append(f"# {name} on {topo}: {_hours(lo)}-{_hours(hi)} chip-hours "
                 f"({lo / chips / 24:,.1f}-{hi / chips / 24:,.1f} days of one {topo}), {which}")
  return lines


def default_tables(configs_dir: str) -> list[str]:
  """docs/pods.md beside ``configs_dir``, then the table tool's default results file."""
  return [os.path.join(os.path.dirname(os.path.abspath(configs_dir)), "docs", "pods.md"),
          os.path.join("runs", "tpu_table.json")]
