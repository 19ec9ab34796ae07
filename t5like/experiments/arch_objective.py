"""Architecture x objective grid (configs/experiments/architecture_objective.py): per cell the
mean over seeds of the prefix-LM held-out loss (same target tokens for every cell), the held-out
span-corruption loss and the 0-shot task score; T5's and Wang et al.'s claims judged by the
experiment's rules; heatmaps of the grid."""
from __future__ import annotations

import math
from typing import Any

import matplotlib
import numpy as np

from t5like.experiments.report import Analysis, Verdict, markdown_table, new_figure, save_figure
from t5like.experiments.spec import ExperimentSpec

ARCHS = ("causal_decoder", "non_causal_decoder", "encoder_decoder", "encoder_decoder_shared")
OBJECTIVES = ("full_lm", "prefix_lm", "span_corruption")
METRICS = (("prefix_loss", "prefix-LM held-out loss (nats)"),
           ("span_loss", "span-corruption held-out loss (nats)"),
           ("task_score", "0-shot task score (mean)"))


def _mean(values) -> float:
  values = [v for v in values if v is not None and not math.isnan(v)]
  return float(np.mean(values)) if values else math.nan


def _task_score(rows) -> tuple[float, float]:
  """Mean over seeds and tasks of each task's first metric, and its standard error (the tasks'
  own standard errors combined as for a mean of independent estimates; 0 where a task has none).
  (NaN, NaN) when no run has task scores."""
  means, errs = [], []
  for r in rows:
    for m in r.get("tasks", {}).get("scores", {}).values():
      if not m or "error" in m:
        continue
      name = next(k for k in m if not k.endswith("_stderr"))
      means.append(m[name])
      errs.append(m.get(f"{name}_stderr", 0.0))
  if not means:
    return math.nan, math.nan
  return float(np.mean(means)), float(np.sqrt(np.sum(np.square(errs))) / len(errs))


def grid(results: dict[str, dict[str, Any]]) -> dict[tuple[str, str], dict[str, float]]:
  """(arch, objective) -> {prefix_loss, span_loss, task_score, seeds}, means over seeds."""
  cells: dict[tuple[str, str], list[dict[str, Any]]] = {}
  for r in results.values():
    cells.setdefault((r["tags"]["arch"], r["tags"]["objective"]), []).append(r)
  return {key: {"prefix_loss": _mean([r.get("eval_loss") for r in rows]),
                "span_loss": _mean([r.get("evals", {}).get("span_corruption", {})
                                    .get("eval_loss") for r in rows]),
                "task_score": _task_score(rows)[0], "task_stderr": _task_score(rows)[1],
                "seeds": len(rows),
                "train_gflops": _mean([(r.get("train_flops") or math.nan) / 1e9 for r in rows])}
          for key, rows in cells.items()}


def judge_t5(cells, margin: float) -> Verdict:
  claim = ("T5: under span corruption, encoder-decoder < non-causal decoder < causal decoder "
           "(held-out span-corruption loss)")
  losses = [cells.get((a, "span_corruption"), {}).get("span_loss", math.nan) for a in ARCHS[:3]]
  c, n, e = losses
  evidence = f"causal {c:.4f}, non-causal {n:.4f}, encoder-decoder {e:.4f} (margin {margin})"
  if any(math.isnan(x) for x in losses):
    return Verdict(claim, "inconclusive", "a span-corruption cell has no score; " + evidence)
  gaps = (n - e, c - n)  # Both positive when the claimed order holds.
  if all(g > margin for g in gaps):
    return Verdict(claim, "supported", evidence)
  if any(g < -margin for g in gaps):
    return Verdict(claim, "contradicted", evidence)
  return Verdict(claim, "inconclusive", evidence)


def judge_wang(cells, margin: float, sigmas: float = 2.0) -> Verdict:
  """The gap to the best other cell must exceed both ``margin`` and ``sigmas`` standard errors of
  the difference (the 0-shot means are over few examples: a gap inside their noise decides
  nothing)."""
  claim = "Wang et al.: causal decoder + full LM is the best 0-shot after pretraining"
  mine = cells.get(("causal_decoder", "full_lm"), {})
  best, best_err = mine.get("task_score", math.nan), mine.get("task_stderr", math.nan)
  others = {k: v for k, v in cells.items()
            if k != ("causal_decoder", "full_lm") and not math.isnan(v["task_score"])}
  if math.isnan(best) or not others:
    return Verdict(claim, "inconclusive", "no 0-shot scores for the comparison")
  runner_up, other = max(others.items(), key=lambda kv: kv[1]["task_score"])
  score = other["task_score"]
  need = max(margin, sigmas * math.hypot(best_err, other.get("task_stderr", 0.0)))
  evidence = (f"causal decoder + full LM {best:.3f} ± {best_err:.3f}; best other "
              f"{'/'.join(runner_up)} {score:.3f} ± {other.get('task_stderr', 0.0):.3f} "
              f"(gap needed {need:.3f}: max of margin {margin} and {sigmas:g} standard errors)")
  if best - score > need:
    return Verdict(claim, "supported", evidence)
  if score - best > need:
    return Verdict(claim, "contradicted", evidence)
  return Verdict(claim, "inconclusive", evidence)


def heatmap(cells, output_dir: str, name: str = "architecture_objective.png") -> str:
  """One panel per metric: architectures (rows) x objectives (columns); missing cells grey."""
  fig, _ = new_figure()
  fig.set_size_inches(13, 4.2)
  fig.clf()
  for k, (metric, title) in enumerate(METRICS):
    ax = fig.add_subplot(1, len(METRICS), k + 1)
    values = np.array([[cells.get((a, o), {}).get(metric, math.nan) for o in OBJECTIVES]
                       for a in ARCHS], np.float64)
    masked = np.ma.masked_invalid(values)
    # Brighter = better.
    cmap = matplotlib.colormaps["viridis_r" if metric.endswith("loss") else "viridis"]
    image = ax.imshow(masked, cmap=cmap.with_extremes(bad="lightgrey"), aspect="auto")
    for (r, c), v in np.ndenumerate(values):
      box = None if math.isnan(v) else {"facecolor": "white", "alpha": 0.7, "lw": 0}
      ax.text(c, r, "n/a" if math.isnan(v) else f"{v:.3f}", ha="center", va="center",
              fontsize=8, bbox=box)
    ax.set_xticks(range(len(OBJECTIVES)), [o.replace("_", "\n") for o in OBJECTIVES], fontsize=8)
    ax.set_yticks(range(len(ARCHS)), [a.replace("_", " ") for a in ARCHS], fontsize=8)
    ax.set_title(title, fontsize=9)
    if masked.count():
      fig.colorbar(image, ax=ax, fraction=0.046)
  return save_figure(fig, output_dir, name)


def analyse(spec: ExperimentSpec, results: dict[str, dict[str, Any]],
            output_dir: str) -> Analysis:
  margin = spec.param("margin", 0.02)
  cells = grid(results)
  verdicts = [judge_t5(cells, margin), judge_wang(cells, margin, spec.param("sigmas", 2.0))]
  rows = [(a, o, v["seeds"], v["prefix_loss"], v["span_loss"], v["task_score"],
           v["train_gflops"])
          for (a, o), v in sorted(cells.items(), key=lambda kv: (ARCHS.index(kv[0][0]),
                                                                 OBJECTIVES.index(kv[0][1])))]
  table = markdown_table(("architecture", "objective", "seeds", "prefix-LM loss",
                          "span-corruption loss", "0-shot score", "train GFLOPs"), rows)
  plot = heatmap(cells, output_dir)
  numbers = {"cells": {f"{a}/{o}": v for (a, o), v in cells.items()}}
  return Analysis(verdicts, [("Grid (means over seeds)", table)], numbers, [plot])
