"""What one experiment is: a claim, a criterion fixed before running, and the runs that test it.

Experiment files live in ``configs/experiments/<name>.py`` and define
``get_experiment(budget) -> ExperimentSpec`` for ``budget`` in ``BUDGETS``. The same spec lists the
paper-scale runs (``paper_runs``), so ``--scale paper`` prints the pod commands of the very
experiment the laptop runs.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

BUDGETS = ("quick", "full")  # quick: plumbing check (whole set <= 15 min); full: <= 3 h in all.


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One training run (and how to score it)."""

  name: str  # Unique within the experiment; also the run's workdir name.
  config: str  # Config file, relative to the repository's configs/ (e.g. "tiny_decllm.py").
  overrides: tuple[str, ...] = ()  # Dotted config overrides (model size, steps, seed, ...).
  eval_overrides: tuple[str, ...] = ()  # Applied when scoring (e.g. "data.objective=prefix").
  tags: tuple[tuple[str, Any], ...] = ()  # What the analysis groups by: family, size, seed, ...
  init_from_run: str = ""  # Finetuning: the run (same experiment) whose checkpoint starts this.
  evals: tuple[tuple[str, tuple[str, ...]], ...] = ()  # Extra held-out scores (label, overrides),
  #   e.g. longer evaluation lengths; added later without retraining (not part of the digest).
  tasks: tuple[str, ...] = ()  # BIG-bench task files/dirs scored 0-shot after training
  #   ("shipped" = t5like/evaluation/tasks); like ``evals``, not part of the digest.

  def tag(self, key: str, default: Any = None) -> Any:
    return dict(self.tags).get(key, default)

  def digest(self) -> str:
    """Changes whenever anything that defines the run changes (re-running then retrains)."""
    fields = dataclasses.asdict(self)
    del fields["evals"], fields["tasks"]
    blob = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class ExperimentSpec:
  """A claim of the paper (or the discussions around it) and how this project tests it."""

  name: str  # Short id, e.g. "scaling".
  claim: str  # The claim in one or two sentences, with where it comes from.
  criterion: str  # The decision rule, written before any run, in words.
  analysis: str  # Module under t5like.experiments that analyses the results (e.g. "scaling").
  runs: tuple[RunSpec, ...]  # Laptop-scale runs of this budget.
  budget: str = "quick"  # One of BUDGETS.
  eval_batches: int = 8  # Held-out batches scored per run.
  scale_note: str = ""  # How the laptop runs were scaled down from the paper, for the report.
  paper_runs: tuple[RunSpec, ...] = ()  # The same experiment at paper scale (for --scale paper).
  params: tuple[tuple[str, Any], ...] = ()  # Analysis settings fixed with the criterion.

  def param(self, key: str, default: Any = None) -> Any:
    return dict(self.params).get(key, default)

  def validate(self) -> "ExperimentSpec":
    if self.budget not in BUDGETS:
      raise ValueError(f"budget {self.budget!r} is not one of {BUDGETS}")
    names = [r.name for r in self.runs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
      raise ValueError(f"experiment {self.name}: duplicate run names {dupes}")
    for r in self.runs:
      if r.init_from_run and r.init_from_run not in names[:names.index(r.name)]:
        raise ValueError(f"run {r.name}: init_from_run={r.init_from_run!r} must name an earlier "
                         f"run of the experiment (one of {names[:names.index(r.name)]})")
    return self
