"""Zero- and few-shot downstream scores of one model on BIG-bench-format tasks.

Multiple-choice tasks: rank classification (``scoring.option_loglikelihoods``), reported as
``multiple_choice_grade`` (raw log-likelihood) and ``multiple_choice_grade_norm`` (per option
token). Generative tasks: greedy decoding with the KV cache (``t5like.inference.generate``),
``exact_str_match`` of the generation cut at the task's stop string (``Task.answer``). A task that fails is reported with its error and
the other tasks still run.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

import numpy as np

from t5like.evaluation.bigbench import Task
from t5like.evaluation.scoring import (ContextTooLong, Truncation, fit_context,
                                       option_loglikelihoods)

log = logging.getLogger(__name__)


def _multiple_choice(model, vocab, task: Task, shots: int, seed: int, trunc: Truncation,
                     on_long: str) -> dict[str, float]:
  pairs, owners = [], []
  for i, ex in enumerate(task.examples):
    ctx = fit_context(list(vocab.encode(task.prompt(ex, task.shots_for(i, shots, seed)))),
                      trunc, on_long)
    for j, choice in enumerate(ex.choices):
      pairs.append((ctx, list(vocab.encode(choice))))
      owners.append((i, j))
  ll = option_loglikelihoods(model, pairs)
  raw = [np.full(len(ex.choices), -np.inf) for ex in task.examples]
  norm = [np.full(len(ex.choices), -np.inf) for ex in task.examples]
  for (i, j), value, (_, opt) in zip(owners, ll, pairs):
    raw[i][j], norm[i][j] = value, value / len(opt)
  grade = np.mean([int(np.argmax(raw[i])) in ex.correct() for i, ex in enumerate(task.examples)])
  grade_n = np.mean([int(np.argmax(norm[i])) in ex.correct()
                     for i, ex in enumerate(task.examples)])
  return {"multiple_choice_grade": float(grade), "multiple_choice_grade_norm": float(grade_n)}


def _generative(model, vocab, task: Task, shots: int, seed: int, trunc: Truncation,
                on_long: str, max_new_tokens: int, batch: int = 32) -> dict[str, float]:
  from t5like.inference import Generator
  prompts = [fit_context(list(vocab.encode(task.prompt(ex, task.shots_for(i, shots, seed)))),
                         trunc, on_long) for i, ex in enumerate(task.examples)]
  longest = max(len(vocab.encode(t)) for ex in task.examples for t in ex.targets)
  new = min(max_new_tokens, longest + 4)
  generate = Generator(model)  # The decode layout once for all batches.
  outs = [o for i in range(0, len(prompts), batch)
          for o in generate(prompts[i:i + batch], max_new_tokens=new, eos_id=vocab.eos_id)]
  hits = [task.answer(vocab.decode(o)) in {t.strip() for t in ex.targets}
          for o, ex in zip(outs, task.examples)]
  return {"exact_str_match": float(np.mean(hits))}


def score_tasks(model, vocab, tasks: Sequence[Task], *, shots: Sequence[int] = (0,),
                seed: int = 0, max_context: int = 1024, on_long: str = "truncate",
                max_new_tokens: int = 32) -> dict[str, Any]:
  """{task: {"<k>-shot": metrics}} plus per-task errors and the truncation count."""
  trunc = Truncation(max_context)
  results: dict[str, Any] = {}
  for task in tasks:
    per: dict[str, Any] = {"file": task.path, "sha256": task.sha256,
                           "examples": len(task.examples)}
    for k in shots:
      try:
        if task.examples[0].is_multiple_choice:
          per[f"{k}-shot"] = _multiple_choice(model, vocab, task, k, seed, trunc, on_long)
        else:
          per[f"{k}-shot"] = _generative(model, vocab, task, k, seed, trunc, on_long,
                                         max_new_tokens)
      except (ContextTooLong, ValueError) as e:
        log.error("task %s (%d-shot) failed: %s", task.name, k, e)
        per[f"{k}-shot"] = {"error": str(e)}
    results[task.name] = per
  if trunc.truncated:
    log.warning("%d contexts were longer than %d tokens and were cut from the left",
                trunc.truncated, max_context)
  return {"tasks": results, "truncated_contexts": trunc.truncated,
          "max_context": max_context}
