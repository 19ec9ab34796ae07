"""``python -m t5like.evaluation.harness_cli``: lm-evaluation-harness's own command line with the
``t5like`` model registered and t5like's task directory (the group ``paper_downstream``) on the
include path, the same flags as ``lm_eval``::

  python -m t5like.evaluation.harness_cli --model t5like --model_args workdir=W[,step=N] \\
    --tasks arc_easy --include_path my_tasks --output_path out
  python -m t5like.evaluation.harness_cli ls tasks

lm-eval 0.4.13 finds models only among its own modules (no plugin entry points), so the
``lm_eval`` script cannot see a model another package registers; this runs that script after
importing ``t5like.evaluation.harness``. Its ``--include_path`` takes one directory, so the
TaskManager it builds is given t5like's before the user's (``harness_run.include_paths``). An
unknown task name is one ``error:`` line (exit status 2), as from ``eval.py --harness``. From
Python, ``import t5like.evaluation.harness`` and ``lm_eval.simple_evaluate(model="t5like",
model_args="workdir=W")`` works the same way.
"""
from __future__ import annotations

import os
import sys

NOT_FOUND = "Tasks not found: "  # lm-eval 0.4's message for unknown --tasks names.


def _with_t5like_tasks():
  """lm-eval's TaskManager, scanning t5like's task directory too (the CLI imports it from
  ``lm_eval.tasks`` when it runs)."""
  import lm_eval.tasks
  from t5like.evaluation.harness_run import include_paths
  base = lm_eval.tasks.TaskManager

  class TaskManager(base):
    last = None  # The newest one: its registry names the known tasks of an error message.

    def __init__(self, *args, include_path=None, **kwargs):
      super().__init__(*args, include_path=include_paths(include_path), **kwargs)
      TaskManager.last = self

  lm_eval.tasks.TaskManager = TaskManager
  return TaskManager


def main() -> int:
  for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):  # Offline unless the caller says.
    os.environ.setdefault(name, "1")
  from t5like import runtime
  runtime.init_tensorflow()  # Quiet start (the vocabulary sits beside seqio / TF).
  import t5like.evaluation.harness  # noqa: F401 — registers "t5like".
  from lm_eval.__main__ import cli_evaluate
  from t5like.evaluation.harness_run import unknown_tasks_message
  manager = _with_t5like_tasks()
  try:
    cli_evaluate()
  except ValueError as e:
    if not str(e).startswith(NOT_FOUND):
      raise
    unknown = [t.strip() for t in str(e)[len(NOT_FOUND):].split(",")]
    user = (manager.last.include_path or [])[1:] if manager.last else []
    known = manager.last.all_tasks if manager.last else []
    print(f"error: {unknown_tasks_message(unknown, known, user)}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
