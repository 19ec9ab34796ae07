"""Registers t5like's corpora with seqio on import: the module for seqio's own tools' and Beam
workers' ``--module_import`` (``seqio_cache_tasks``, ``seqio_inspect_tasks``, a T5X gin file).

Without settings it registers the embedded corpora (``embedded_redpajama.<subset>:lm`` and the
``embedded_flan`` tasks). ``$T5LIKE_SEQIO_CORPORA`` adds corpora on disk, a JSON list of
``{"corpus": "redpajama" | "flan" | ..., "data_dir": ..., "validation_dir": ...,
"config": ["data.vocab_path=...", ...]}`` (the arguments of ``t5like.tools.cache_data``).
Every task carries its ``CacheDatasetPlaceholder`` (`t5like.data.caching`). t5like itself trains
from the caches ``python -m t5like.tools.cache_data`` builds (``data.cache_dir``): they keep the
source order and record what they were built from.
"""
from __future__ import annotations

import json
import os

from t5like.data import tasks as _tasks

ENV = "T5LIKE_SEQIO_CORPORA"


def register_all() -> list[str]:
  """Registers the embedded corpora and those of ``$T5LIKE_SEQIO_CORPORA``; their mixtures."""
  entries = [{"corpus": "embedded_redpajama"}, {"corpus": "embedded_flan"}]
  entries += json.loads(os.environ.get(ENV, "") or "[]")
  return [_tasks.register(_tasks.cache_spec(
      e["corpus"], e.get("data_dir", ""), e.get("validation_dir", ""), e.get("config", [])))
          for e in entries]


MIXTURES = register_all()
