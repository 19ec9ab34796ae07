"""``eval.py --harness TASKS``: lm-evaluation-harness tasks on one or more checkpoints.

Each checkpoint is restored as a ``T5LikeLM`` (``harness.py``) and evaluated by the harness's own
``simple_evaluate`` (its prompts, few-shot sampling and metrics, untouched). Offline: the
datasets library runs with ``HF_DATASETS_OFFLINE=1`` and the hub with ``HF_HUB_OFFLINE=1`` unless
the caller set them; tasks come from the harness's registry or from YAML under
``--include_path`` (local data files through the ``json`` loader, or a pre-filled HF datasets
cache) or ``harness_tasks/`` here: the group ``paper_downstream``, 13 of the harness's tasks
standing for the paper's downstream set (docs/evaluation.md says which and why). A task that is unknown or whose data cannot be read is one error naming
it (for a group, the member task) and what to give instead.

Writes, from process 0: ``<output_dir>/harness_<name>_step<N>.json`` (the harness's results
JSON per checkpoint), ``report.md`` (one table: every task's metrics side by side, with standard
errors) and ``harness.png`` (per task, the [0, 1] metrics of each checkpoint with 95 % intervals).
"""
from __future__ import annotations

import difflib
import json
import logging
import math
import os
from typing import Any, Sequence

from etils import epath

from t5like.errors import UserError

log = logging.getLogger(__name__)
# t5like's own task YAMLs (package data, always on the include path) and the group standing for
# the paper's downstream tasks defined there.
TASKS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "harness_tasks")
PAPER_GROUP = "paper_downstream"
LIST_TASKS = "python -m t5like.evaluation.harness_cli ls tasks"


class HarnessTaskError(UserError, ValueError):
  """A harness task that is unknown or whose data is missing; the message names it."""


def require_lm_eval() -> None:
  import importlib.util
  if importlib.util.find_spec("lm_eval") is None:
    raise UserError("--harness needs lm-evaluation-harness: pip install -e '.[harness]' (or "
                    "`make test-harness` for its environment, .venv-harness)")


def _offline() -> None:
  for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
    os.environ.setdefault(name, "1")


def task_names(spec: str) -> list[str]:
  return [t.strip() for t in spec.split(",") if t.strip()]


def include_paths(include_path: Sequence[str] | str | None = ()) -> list[str]:
  """The task directories a TaskManager scans besides lm-eval's own: t5like's, then the user's
  (a later one overrides a task of the same name)."""
  user = [include_path] if isinstance(include_path, str) else list(include_path or ())
  return [TASKS_DIR] + [p for p in user if p]


def unknown_tasks_message(unknown: Sequence[str], known: Sequence[str],
                          include_path: Sequence[str] = ()) -> str:
  """One message naming the unknown tasks, the nearest known names and the fix."""
  near = sorted({m for n in unknown for m in difflib.get_close_matches(n, known, n=3)})
  where = f" or in {', '.join(include_path)}" if include_path else ""
  return (f"unknown harness task(s) {', '.join(unknown)}: not in lm-eval's registry{where}"
          + (f" (did you mean {', '.join(near)}?)" if near else "")
          + f"; give a name from `{LIST_TASKS}` (13 downstream tasks: {PAPER_GROUP}), or "
          "--include_path DIR with the task's YAML")


def _leaves(manager, name: str) -> list[str]:
  """The tasks of a group (recursively), or ``[name]`` for a task."""
  entry = manager.task_index.get(name)
  group = entry is not None and entry.kind.name == "GROUP"
  members = (entry.cfg or {}).get("task") if group else None
  if not members:
    return [name]
  return [leaf for m in members if isinstance(m, str) for leaf in _leaves(manager, m)]


def _load_one(manager, name: str):
  """Builds task or group ``name``; data that cannot be read is one error naming the task."""
  try:
    return manager.load([name])
  except Exception as e:  # noqa: BLE001 — the datasets library raises many kinds.
    failed = name
    for leaf in (_leaves(manager, name) if manager.task_index.get(name) else []):
      if leaf == name:
        break
      try:
        manager.load([leaf])
      except Exception as leaf_error:  # noqa: BLE001
        failed, e = f"{leaf} (of group {name})", leaf_error
        break
    raise HarnessTaskError(
        f"harness task {failed}: its data could not be read offline ({type(e).__name__}: "
        f"{str(e).splitlines()[0] if str(e) else ''}); give the local data files its YAML "
        "names (dataset_path: json, dataset_kwargs.data_files), or pre-fill the HF datasets "
        "cache (HF_DATASETS_CACHE) on a machine with network") from None


def load_tasks(names: Sequence[str], include_path: Sequence[str] = ()):
  """(task manager, {name: task dict}) with every task built (its data read) up front, so that
  a missing task or data set fails before any model runs."""
  _offline()
  from lm_eval.tasks import TaskManager
  manager = TaskManager(include_path=include_paths(include_path))
  unknown = [n for n in names if n not in manager.all_tasks]
  if unknown:
    raise HarnessTaskError(unknown_tasks_message(unknown, manager.all_tasks, include_path))
  return manager, {name: _load_one(manager, name) for name in names}


def evaluate(lm, names: Sequence[str], manager, *, num_fewshot: int | None = None,
             limit: float | None = None, log_samples: bool = False) -> dict[str, Any]:
  import lm_eval
  return lm_eval.simple_evaluate(model=lm, tasks=list(names), num_fewshot=num_fewshot,
                                 limit=limit, task_manager=manager, log_samples=log_samples)


def _metrics(task_results: dict[str, Any]) -> dict[str, tuple[float, float | None]]:
  """{"metric,filter": (value, stderr or None)} of one task's harness results."""
  out = {}
  for key, value in task_results.items():
    if "," not in key or "_stderr," in key or not isinstance(value, (int, float)):
      continue
    metric, filt = key.split(",", 1)
    err = task_results.get(f"{metric}_stderr,{filt}")
    out[key] = (float(value), float(err) if isinstance(err, (int, float)) else None)
  return out


def write_markdown(runs: dict[str, dict[str, Any]]) -> str:
  """One table: a row per task and metric, a column per checkpoint (value ± standard error)."""
  names = list(runs)
  lines = ["# lm-evaluation-harness", "",
           "| checkpoint | step | family | results |", "|---|---|---|---|"]
  for name, run in runs.items():
    lines.append(f"| {name} | {run['step']} | {run['family']} | {run['file']} |")
  lines += ["", "| task | metric | " + " | ".join(names) + " |",
            "|---|---|" + "---|" * len(names)]
  tasks = sorted({t for run in runs.values() for t in run["results"]["results"]})
  for task in tasks:
    per = {n: _metrics(runs[n]["results"]["results"].get(task, {})) for n in names}
    for key in sorted({k for m in per.values() for k in m}):
      cells = []
      for n in names:
        v = per[n].get(key)
        cells.append("" if v is None else f"{v[0]:.4f}" + (f" ± {v[1]:.4f}" if v[1] else ""))
      lines.append(f"| {task} | {key} | " + " | ".join(cells) + " |")
  shots = {t: s for run in runs.values() for t, s in run["results"].get("n-shot", {}).items()}
  if shots:
    lines += ["", "Few-shot examples per task: " + ", ".join(f"{t} {s}" for t, s in
                                                          sorted(shots.items()))]
  return "\n".join(lines) + "\n"


def plot(runs: dict[str, dict[str, Any]], path) -> str | None:
  """Per task and [0, 1] metric, one bar per checkpoint with its 95 % interval."""
  from t5like.evaluation.report import plot_task_grades
  grades: dict[str, dict[str, tuple[float, float]]] = {}
  for name, run in runs.items():
    for task, res in run["results"]["results"].items():
      for key, (value, err) in _metrics(res).items():
        if 0.0 <= value <= 1.0 and not math.isnan(value):
          grades.setdefault(f"{task} {key.split(',')[0]}", {})[name] = (
              value, 1.96 * (err or 0.0))
  if not grades:
    return None
  return plot_task_grades(grades, {n: n for n in runs}, path)


def _name(path: str, seen: dict) -> str:
  base = epath.Path(path).name or "model"
  name, i = base, 1
  while name in seen:
    i += 1
    name = f"{base}_{i}"
  return name


def run_harness(paths: Sequence[str], tasks: str, *, output_dir: str, step: int | None = None,
                include_path: Sequence[str] = (), num_fewshot: int | None = None,
                limit: float | None = None, model_args: dict[str, Any] | None = None
                ) -> dict[str, dict[str, Any]]:
  """Evaluates every checkpoint on ``tasks`` (comma-separated); writes the reports (process 0)."""
  require_lm_eval()
  import jax
  from lm_eval.utils import handle_non_serializable
  from t5like.evaluation.harness import T5LikeLM
  names = task_names(tasks)
  if not names:
    raise HarnessTaskError("--harness needs task names, e.g. --harness arc_easy,hellaswag")
  manager, _ = load_tasks(names, include_path)
  out = epath.Path(output_dir)
  writer = jax.process_index() == 0
  if writer:
    out.mkdir(parents=True, exist_ok=True)
  runs: dict[str, dict[str, Any]] = {}
  for path in paths:
    lm = T5LikeLM(workdir=path, step=step, **(model_args or {}))
    results = evaluate(lm, names, manager, num_fewshot=num_fewshot, limit=limit)
    step_num = int(epath.Path(lm.step_dir).name)
    name = _name(path, runs)
    file = f"harness_{name}_step{step_num}.json"
    results["t5like"] = {"checkpoint": lm.step_dir, "step": step_num, "family": lm.family}
    if writer:
      (out / file).write_text(json.dumps(results, indent=2, default=handle_non_serializable))
    runs[name] = {"step": step_num, "family": lm.family, "file": file, "results": results}
    del lm
  if writer:
    (out / "report.md").write_text(write_markdown(runs))
    png = plot(runs, out / "harness.png")
    if png:
      log.info("wrote %s", png)
  return runs


def main(args, overrides: Sequence[str]) -> int:
  """``eval.py --harness``: the flags of eval.py's parser, reports under ``--output_dir``."""
  from t5like.config import ConfigError
  if overrides:
    raise ConfigError("--config.* overrides do not apply to --harness")
  out = args.output_dir or str(epath.Path(args.workdir[0]) / "eval" / "harness")
  runs = run_harness(args.workdir, args.harness, output_dir=out, step=args.step,
                     include_path=args.include_path, num_fewshot=args.num_fewshot,
                     limit=args.limit)
  import jax
  if jax.process_index() == 0:
    print(write_markdown(runs))
    print(f"report: {out}/report.md, results: "
          f"{', '.join(run['file'] for run in runs.values())}")
  return 0
