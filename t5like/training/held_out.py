"""Held-out token loss, perplexity and accuracy over a finite iterator of packed batches, and
a mixture's held-out metrics from its parts'.

Shared by the trainer's periodic eval and by ``eval.py`` (so it lives in training, below
evaluation). Sums are taken on device and summed over batches; per-token values divide by the
number of target tokens (``weight``). ``eval_loss`` (and accuracy, loss with z) of a mixture is
the rate-weighted average of its parts' per-token values — the mixture's expected loss under its
own mixing rates — each part scored on ``t5like.data.held_out``'s fixed sample (the same rows at
every eval and on any host count) and reported as ``eval/<part>/loss`` and
``eval/<part>/accuracy``.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Callable, Iterator, Mapping, Sequence

import jax
import numpy as np

log = logging.getLogger(__name__)
_AVERAGED = ("eval_loss", "eval_loss_with_z", "eval_accuracy")
_WARNED: set[str] = set()


def pad_rows(batch: Mapping[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
  """Pads a short last batch with all-zero rows (segment 0: no loss, no attention)."""
  out = {}
  for k, v in batch.items():
    v = np.asarray(v)
    if v.shape[0] < rows:
      v = np.concatenate([v, np.zeros((rows - v.shape[0],) + v.shape[1:], v.dtype)])
    out[k] = v
  return out


def _anyone_has(has_batch: bool, has_template: bool) -> bool:
  """Whether any process has a batch left (the same answer on every process)."""
  if jax.process_count() == 1:
    return has_batch
  from jax.experimental import multihost_utils
  flags = np.asarray(multihost_utils.process_allgather(
      np.asarray([has_batch, has_template], np.int32))).reshape(-1, 2)
  if flags[:, 0].any() and not flags[:, 1].all():
    raise RuntimeError(  # Raised on every process alike (same gathered flags).
        "a process has no held-out batch at all while others have data (its validation shard "
        "is empty): use fewer processes for evaluation or a larger validation split")
  return bool(flags[:, 0].any())


def held_out_metrics(eval_step: Callable, params: Any, batches: Iterator[Mapping[str, np.ndarray]],
                     to_global: Callable[[Mapping[str, np.ndarray]], Any],
                     max_batches: int) -> dict[str, float]:
  """Runs ``eval_step(params, batch) -> weighted sums`` over up to ``max_batches`` batches.

  Returns ``eval_loss`` (cross-entropy per target token, nats), ``eval_perplexity``,
  ``eval_loss_with_z``, ``eval_accuracy``, ``eval_tokens`` and ``eval_batches``; ``{}`` when the
  iterator is empty. ``max_batches <= 0`` reads the iterator to its end.

  Several processes run in lock-step: before each batch they agree whether any of them still
  has data; one whose shard is exhausted feeds all-zero rows (weight 0: the sums are unchanged),
  so every process runs the same number of collective eval steps and none waits forever.
  """
  sums, n, template = None, 0, None
  while not 0 < max_batches <= n:
    local = next(batches, None)
    if local is not None and template is None:
      template = {k: np.zeros_like(np.asarray(v)) for k, v in local.items()}
    if not _anyone_has(local is not None, template is not None):
      break
    out = eval_step(params, to_global(local if local is not None else template))
    sums = out if sums is None else jax.tree.map(lambda a, b: a + b, sums, out)
    n += 1
  if sums is None:
    return {}
  sums = {k: float(v) for k, v in jax.device_get(sums).items()}
  w = max(sums["weight"], 1.0)
  loss = sums["cross_entropy"] / w
  return {"eval_loss": loss, "eval_perplexity": math.exp(min(loss, 50.0)),
          "eval_loss_with_z": sums["loss"] / w, "eval_accuracy": sums["correct"] / w,
          "eval_tokens": sums["weight"], "eval_batches": n}


def combine(per_part: Sequence[tuple[str, float, Mapping[str, float]]]) -> dict[str, float]:
  """``(name, rate, metrics)`` of each part -> the mixture's metrics plus per-part entries.

  Parts with no held-out rows (empty metrics) are left out and the others' rates renormalized.
  One part: its metrics as they are.
  """
  scored = [(n, r, m) for n, r, m in per_part if m]
  if not scored:
    return {}
  if len(per_part) == 1:
    return dict(scored[0][2])
  for n, _, m in per_part:
    if not m and n not in _WARNED:  # Once per part and process: the same at every eval.
      _WARNED.add(n)
      log.warning("held-out part %s has no validation rows; the mixture's eval_loss averages "
                  "the other parts", n)
  total = sum(r for _, r, _ in scored)
  out = {k: sum(r * m[k] for _, r, m in scored) / total for k in _AVERAGED}
  out["eval_perplexity"] = math.exp(min(out["eval_loss"], 50.0))
  out["eval_tokens"] = sum(m["eval_tokens"] for _, _, m in scored)
  out["eval_batches"] = sum(m["eval_batches"] for _, _, m in scored)
  for n, _, m in scored:
    out[f"eval/{n}/loss"] = m["eval_loss"]
    out[f"eval/{n}/accuracy"] = m["eval_accuracy"]
  return out


def score_parts(eval_step: Callable, params: Any,
                parts: Sequence[tuple[str, float, Callable[[], Any], int]],
                to_global: Callable) -> list[tuple[str, float, dict[str, float]]]:
  """``(name, rate, metrics)`` of each ``(name, rate, open_iterator, max_batches)`` part."""
  out = []
  for name, rate, open_iterator, max_batches in parts:
    it = open_iterator()
    try:
      out.append((name, rate, held_out_metrics(eval_step, params, it, to_global, max_batches)))
    finally:
      if hasattr(it, "close"):
        it.close()
  return out


def evaluate_parts(eval_step: Callable, params: Any,
                   parts: Sequence[tuple[str, float, Callable[[], Any], int]],
                   to_global: Callable) -> dict[str, float]:
  """Scores each ``(name, rate, open_iterator, max_batches)`` part and combines them."""
  return combine(score_parts(eval_step, params, parts, to_global))
