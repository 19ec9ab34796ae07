"""Findings 4-5 after instruction tuning: held-out FLAN loss per variant against inference FLOPs
per sequence (forward FLOPs of one input + target sequence, docs/flops.md), judged by the
experiment's written rule."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from t5like.experiments.report import Analysis, Verdict, markdown_table, new_figure, save_figure
from t5like.experiments.spec import ExperimentSpec

LABELS = {"decllm": "DecLLM", "decllm_biattn": "DecLLM + BiAttn", "redllm": "RedLLM"}


def _arms(results) -> dict[str, list[dict[str, Any]]]:
  arms: dict[str, list[dict[str, Any]]] = {}
  for r in results.values():
    if r["tags"].get("stage") == "finetune" and r.get("eval_loss") is not None:
      arms.setdefault(r["tags"]["variant"], []).append(r)
  return arms


def _mean_sd(rows) -> tuple[float, float, int]:
  a = np.asarray([r["eval_loss"] for r in rows], np.float64)
  return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else math.nan, len(a)


def _difference(arms, a: str, b: str, sigmas: float) -> tuple[float, float, str]:
  """(mean_a - mean_b, noise, why-not) for two arms."""
  if a not in arms or b not in arms:
    return math.nan, math.nan, "an arm has no finished run"
  (ma, sa, na), (mb, sb, nb) = _mean_sd(arms[a]), _mean_sd(arms[b])
  if na < 2 or nb < 2:
    return ma - mb, math.nan, f"{na}/{nb} seeds (the rule needs >= 2 per arm)"
  return ma - mb, sigmas * math.sqrt(sa ** 2 / na + sb ** 2 / nb), ""


def task_mean(rows) -> float:
  """Mean over seeds and tasks of each task's first metric (multiple-choice grade or exact
  match) from the runs' 0-shot scores; NaN when no run has task scores."""
  values = [next(iter(m.values())) for r in rows
            for m in r.get("tasks", {}).get("scores", {}).values()
            if m and "error" not in m]
  return float(np.mean(values)) if values else math.nan


def analyse(spec: ExperimentSpec, results: dict[str, dict[str, Any]],
            output_dir: str) -> Analysis:
  sigmas = spec.param("sigmas", 2.0)
  arms = _arms(results)
  flops = {v: rows[0]["inference_flops_per_sequence"] for v, rows in arms.items()}
  verdicts = []
  claim4 = "RedLLM matches or beats DecLLM after instruction tuning at lower inference FLOPs"
  d, noise, why = _difference(arms, "redllm", "decllm", sigmas)
  if why:
    verdicts.append(Verdict(claim4, "inconclusive", f"loss(Red) - loss(Dec) = {d:+.4f}; {why}"))
  else:
    cheaper = flops.get("redllm", math.inf) < flops.get("decllm", 0)
    verdict = ("contradicted" if d > noise else "supported" if cheaper else "inconclusive")
    verdicts.append(Verdict(claim4, verdict, f"loss(Red) - loss(Dec) = {d:+.4f} vs noise "
                            f"{noise:.4f}; inference FLOPs/seq Red {flops.get('redllm', 0):.3g} "
                            f"vs Dec {flops.get('decllm', 0):.3g}"))
  claim5 = "Bidirectional attention over the input (DecLLM + BiAttn) improves DecLLM"
  d, noise, why = _difference(arms, "decllm_biattn", "decllm", sigmas)
  if why:
    verdicts.append(Verdict(claim5, "inconclusive", f"loss(BiAttn) - loss(Dec) = {d:+.4f}; {why}"))
  else:
    verdict = "supported" if d < -noise else "contradicted" if d > noise else "inconclusive"
    verdicts.append(Verdict(claim5, verdict, f"loss(BiAttn) - loss(Dec) = {d:+.4f} vs noise "
                            f"{noise:.4f}"))
  rows = []
  task_means = {v: task_mean(r) for v, r in arms.items()}
  for variant in LABELS:
    if variant in arms:
      mean, sd, n = _mean_sd(arms[variant])
      rows.append((LABELS[variant], n, mean, sd, task_means[variant], flops[variant],
                   arms[variant][0]["params"]))
  table = markdown_table(("model", "seeds", "held-out FLAN loss", "std",
                          "0-shot task score (reported, not in the rule)",
                          "inference FLOPs / sequence", "params"), rows)
  fig, ax = new_figure()
  for variant, label in LABELS.items():
    if variant in arms:
      mean, sd, _ = _mean_sd(arms[variant])
      ax.errorbar([flops[variant]], [mean], yerr=[np.nan_to_num(sd)], fmt="o", capsize=4,
                  label=label)
  ax.set_xlabel("inference FLOPs per sequence (prefill + KV-cache decode)")
  ax.set_ylabel("held-out FLAN loss (nats / target token)")
  ax.set_title("Quality vs inference cost after instruction tuning")
  ax.legend(fontsize=8)
  plot = save_figure(fig, output_dir, "quality_vs_inference_flops.png")
  numbers = {"arms": {v: dict(zip(("mean", "std", "n"), _mean_sd(r))) for v, r in arms.items()},
             "inference_flops_per_sequence": flops, "task_score": task_means}
  return Analysis(verdicts, [("After instruction tuning", table)], numbers, [plot])
