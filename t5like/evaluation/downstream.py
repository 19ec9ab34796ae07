"""Zero- and few-shot downstream scores of one model on BIG-bench-format tasks.

Multiple-choice tasks: rank classification (``scoring.option_loglikelihoods``), graded as
BIG-bench's ``multiple_choice_grade`` — the mean over the task's distinct examples of the target
score of the option with the highest log-likelihood (partial credit counts; ties broken as
``bigbench.argmax``) — and ``multiple_choice_grade_norm`` (the same on per-token
log-likelihoods). Generative tasks: greedy decoding with the KV cache
(``t5like.inference.generate``), ``exact_str_match`` of the generation cut at the task's stop
string (``Task.answer``). Each metric comes with its standard error over examples
(``<metric>_stderr``). A task that fails is reported with its error and the other tasks still
run.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

import numpy as np

from t5like.evaluation.bigbench import SEED, Task, grade
from t5like.evaluation.scoring import (ContextTooLong, Truncation, fit_context,
                                       option_loglikelihoods)

log = logging.getLogger(__name__)


def _summary(name: str, values: Sequence[float]) -> dict[str, float]:
  """The mean of per-example scores and its standard error (for confidence intervals)."""
  v = np.asarray(values, np.float64)
  err = float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else 0.0
  return {name: float(v.mean()), f"{name}_stderr": err}


def _multiple_choice(model, vocab, task: Task, shots: int, seed: int, trunc: Truncation,
                     on_long: str) -> dict[str, float]:
  """BIG-bench's ``multiple_choice_grade``: the mean over distinct examples of the chosen
  option's target score (ties broken by ``bigbench.argmax``), on raw and per-token
  log-likelihoods."""
  pairs, owners = [], []
  for i, (ex, prompt) in enumerate(zip(task.examples, task.prompts(shots, seed))):
    ctx = fit_context(list(vocab.encode(prompt)), trunc, on_long)
    for j, choice in enumerate(ex.choices):
      pairs.append((ctx, list(vocab.encode(choice))))
      owners.append((i, j))
  ll = option_loglikelihoods(model, pairs)
  raw = [np.full(len(ex.choices), -np.inf) for ex in task.examples]
  norm = [np.full(len(ex.choices), -np.inf) for ex in task.examples]
  for (i, j), value, (_, opt) in zip(owners, ll, pairs):
    raw[i][j], norm[i][j] = value, value / len(opt)
  return {**_summary("multiple_choice_grade",
                     [grade(ex, raw[i]) for i, ex in enumerate(task.examples)]),
          **_summary("multiple_choice_grade_norm",
                     [grade(ex, norm[i]) for i, ex in enumerate(task.examples)])}


def _generative(model, vocab, task: Task, shots: int, seed: int, trunc: Truncation,
                on_long: str, max_new_tokens: int, batch: int = 32) -> dict[str, float]:
  from t5like.inference import Generator
  prompts = [fit_context(list(vocab.encode(p)), trunc, on_long)
             for p in task.prompts(shots, seed)]
  longest = max(len(vocab.encode(t)) for ex in task.examples for t in ex.targets)
  new = min(max_new_tokens, longest + 4)
  generate = Generator(model)  # The decode layout once for all batches.
  outs = [o for i in range(0, len(prompts), batch)
          for o in generate(prompts[i:i + batch], max_new_tokens=new, eos_id=vocab.eos_id)]
  hits = [float(task.answer(vocab.decode(o)) in {t.strip() for t in ex.targets})
          for o, ex in zip(outs, task.examples)]
  return _summary("exact_str_match", hits)


def score_tasks(model, vocab, tasks: Sequence[Task], *, shots: Sequence[int] = (0,),
                seed: int = SEED, max_context: int = 1024, on_long: str = "truncate",
                max_new_tokens: int = 32) -> dict[str, Any]:
  """{task: {"<k>-shot": metrics}} plus per-task errors and the truncation count."""
  trunc = Truncation(max_context)
  results: dict[str, Any] = {}
  for task in tasks:
    per: dict[str, Any] = {"file": task.path, "sha256": task.sha256,
                           "examples": len(task.examples), "duplicates": task.duplicates}
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
