"""Training: sharded state, Adafactor step, Orbax checkpoints, metrics, the loop (``run``)."""
from __future__ import annotations


def run(cfg, workdir, **kwargs):
  """Trains ``cfg`` in ``workdir``; see ``t5like.training.loop.run``."""
  from t5like.training.loop import run as _run
  return _run(cfg, workdir, **kwargs)


__all__ = ["run"]
