"""Held-out token loss, perplexity and accuracy over a finite iterator of packed batches.

Shared by the trainer's periodic eval and by ``eval.py``. Sums are taken on device and summed
over batches; per-token values divide by the number of target tokens (``weight``).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterator, Mapping

import jax
import numpy as np


def pad_rows(batch: Mapping[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
  """Pads a short last batch with all-zero rows (segment 0: no loss, no attention)."""
  out = {}
  for k, v in batch.items():
    v = np.asarray(v)
    if v.shape[0] < rows:
      v = np.concatenate([v, np.zeros((rows - v.shape[0],) + v.shape[1:], v.dtype)])
    out[k] = v
  return out


def held_out_metrics(eval_step: Callable, params: Any, batches: Iterator[Mapping[str, np.ndarray]],
                     to_global: Callable[[Mapping[str, np.ndarray]], Any],
                     max_batches: int) -> dict[str, float]:
  """Runs ``eval_step(params, batch) -> weighted sums`` over up to ``max_batches`` batches.

  Returns ``eval_loss`` (cross-entropy per target token, nats), ``eval_perplexity``,
  ``eval_loss_with_z``, ``eval_accuracy``, ``eval_tokens`` and ``eval_batches``; ``{}`` when the
  iterator is empty. ``max_batches <= 0`` reads the iterator to its end.
  """
  sums, n = None, 0
  for local in batches:
    out = eval_step(params, to_global(local))
    sums = out if sums is None else jax.tree.map(lambda a, b: a + b, sums, out)
    n += 1
    if 0 < max_batches <= n:
      break
  if sums is None:
    return {}
  sums = {k: float(v) for k, v in jax.device_get(sums).items()}
  w = max(sums["weight"], 1.0)
  loss = sums["cross_entropy"] / w
  return {"eval_loss": loss, "eval_perplexity": math.exp(min(loss, 50.0)),
          "eval_loss_with_z": sums["loss"] / w, "eval_accuracy": sums["correct"] / w,
          "eval_tokens": sums["weight"], "eval_batches": n}
