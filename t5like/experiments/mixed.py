"""Mixed forward/backward attention vs bidirectional attention, same budget (the discussions'
proposal, docs/paper.md): mean held-out loss per arm over seeds, judged by the experiment's rule."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from t5like.experiments.report import Analysis, Verdict, markdown_table, new_figure, save_figure
from t5like.experiments.spec import ExperimentSpec


def _arms(results) -> dict[tuple[str, str], list[float]]:
  arms: dict[tuple[str, str], list[float]] = {}
  for r in results.values():
    if r.get("eval_loss") is not None:
      arms.setdefault((r["tags"]["base"], r["tags"]["variant"]), []).append(r["eval_loss"])
  return arms


def _stats(losses: list[float]) -> tuple[float, float, int]:
  a = np.asarray(losses, np.float64)
  return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else math.nan, len(a)


def _judge(base: str, variant: str, arms, sigmas: float) -> Verdict:
  claim = f"{base}: {variant} mixed attention at least as good as bidirectional"
  if (base, variant) not in arms or (base, "none") not in arms:
    return Verdict(claim, "inconclusive", "an arm has no finished run")
  (mm, sm, nm), (mb, sb, nb) = _stats(arms[base, variant]), _stats(arms[base, "none"])
  d = mm - mb
  if nm < 2 or nb < 2:
    return Verdict(claim, "inconclusive", f"d = {d:+.4f} nats with {nm}/{nb} seeds "
                   "(the rule needs >= 2 per arm)")
  noise = sigmas * math.sqrt(sm ** 2 / nm + sb ** 2 / nb)
  verdict = "supported" if d < -noise else "contradicted" if d > noise else "inconclusive"
  return Verdict(claim, verdict, f"d = {d:+.4f} nats vs noise {noise:.4f} ({nm}/{nb} seeds)")


def analyse(spec: ExperimentSpec, results: dict[str, dict[str, Any]],
            output_dir: str) -> Analysis:
  arms = _arms(results)
  sigmas = spec.param("sigmas", 2.0)
  bases = sorted({b for b, _ in arms})
  verdicts = [_judge(b, v, arms, sigmas) for b in bases for v in ("per_head", "per_layer")]
  rows = []
  for (b, v), losses in sorted(arms.items()):
    mean, std, n = _stats(losses)
    rows.append((b, v, n, mean, std))
  table = markdown_table(("base", "attention", "seeds", "mean held-out loss", "std"), rows)
  fig, ax = new_figure()
  for i, b in enumerate(bases):
    variants = [v for bb, v in sorted(arms) if bb == b]
    means = [_stats(arms[b, v])[0] for v in variants]
    errs = [np.nan_to_num(_stats(arms[b, v])[1]) for v in variants]
    xs = np.arange(len(variants)) + 0.3 * i
    ax.bar(xs, means, width=0.28, yerr=errs, label=b)
    ax.set_xticks(np.arange(len(variants)) + 0.15, variants)
  ax.set_ylabel("held-out loss (nats / target token)")
  ax.set_title("Bidirectional (none) vs mixed forward/backward attention")
  if arms:
    lo = min(min(v) for v in arms.values())
    ax.set_ylim(bottom=0.95 * lo)
  ax.legend(fontsize=8)
  plot = save_figure(fig, output_dir, "mixed_attention.png")
  numbers = {"arms": {f"{b}/{v}": dict(zip(("mean", "std", "n"), _stats(l)))
                      for (b, v), l in arms.items()}}
  return Analysis(verdicts, [("Held-out loss per arm", table)], numbers, [plot])
