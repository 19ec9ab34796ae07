"""``python -m t5like.evaluation.harness_cli``: lm-evaluation-harness's own command line with the
``t5like`` model registered, the same flags as ``lm_eval``::

  python -m t5like.evaluation.harness_cli --model t5like --model_args workdir=W[,step=N] \\
    --tasks arc_easy --include_path my_tasks --output_path out

lm-eval 0.4.13 finds models only among its own modules (no plugin entry points), so the
``lm_eval`` script cannot see a model another package registers; this runs that script after
importing ``t5like.evaluation.harness``. From Python, ``import t5like.evaluation.harness`` and
``lm_eval.simple_evaluate(model="t5like", model_args="workdir=W")`` works the same way.
"""
from __future__ import annotations

import os
import sys


def main() -> None:
  for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):  # Offline unless the caller says.
    os.environ.setdefault(name, "1")
  from t5like import runtime
  runtime.init_tensorflow()  # Quiet start (the vocabulary sits beside seqio / TF).
  import t5like.evaluation.harness  # noqa: F401 — registers "t5like".
  from lm_eval.__main__ import cli_evaluate
  cli_evaluate()


if __name__ == "__main__":
  sys.exit(main())
