"""Finding 3: held-out loss against evaluation length (k x the training length), per family, and
the rule of configs/experiments/length_extrapolation.py on the degradation at the longest k."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from t5like.experiments.report import Analysis, Verdict, markdown_table, new_figure, save_figure
from t5like.experiments.spec import ExperimentSpec

FAMILIES = ("decllm", "redllm")


def _curves(results, factors) -> dict[str, np.ndarray]:
  """family -> [seeds, factors] held-out losses (runs missing a length are left out)."""
  out: dict[str, list[list[float]]] = {}
  for r in results.values():
    evals = r.get("evals", {})
    if all(evals.get(f"x{k}", {}).get("eval_loss") is not None for k in factors):
      out.setdefault(r["family"], []).append([evals[f"x{k}"]["eval_loss"] for k in factors])
  return {f: np.asarray(v, np.float64) for f, v in out.items()}


def analyse(spec: ExperimentSpec, results: dict[str, dict[str, Any]],
            output_dir: str) -> Analysis:
  factors = tuple(spec.param("factors", (1, 2, 4, 8)))
  sigmas = spec.param("sigmas", 2.0)
  curves = _curves(results, factors)
  claim = "DecLLM degrades more than RedLLM at the longest evaluation length"
  if not all(f in curves for f in FAMILIES):
    verdict = Verdict(claim, "inconclusive", "a family has no complete length curve")
  else:
    deg = {f: curves[f][:, -1] - curves[f][:, 0] for f in FAMILIES}
    gap = float(deg["decllm"].mean() - deg["redllm"].mean())
    n = {f: len(deg[f]) for f in FAMILIES}
    text = (f"D_Dec({factors[-1]}) - D_Red({factors[-1]}) = {gap:+.4f} nats "
            f"({n['decllm']}/{n['redllm']} seeds)")
    if min(n.values()) < 2:
      verdict = Verdict(claim, "inconclusive", text + "; the rule needs >= 2 seeds per family")
    else:
      noise = sigmas * math.sqrt(sum(deg[f].var(ddof=1) / n[f] for f in FAMILIES))
      v = "supported" if gap > noise else "contradicted" if gap < -noise else "inconclusive"
      verdict = Verdict(claim, v, text + f" vs noise {noise:.4f}")
  rows = [(f, len(c)) + tuple(float(x) for x in c.mean(axis=0)) for f, c in curves.items()]
  table = markdown_table(("family", "seeds") + tuple(f"loss @ {k}x" for k in factors), rows)
  fig, ax = new_figure()
  for f, c in sorted(curves.items()):
    ax.errorbar(factors, c.mean(axis=0), yerr=c.std(axis=0, ddof=1) if len(c) > 1 else None,
                marker="o", capsize=3, label=f)
  ax.set_xscale("log", base=2)
  ax.set_xticks(factors, [f"{k}x" for k in factors])
  ax.set_xlabel("evaluation length / training length")
  ax.set_ylabel("held-out loss (nats / target token)")
  ax.set_title("Length extrapolation")
  ax.legend()
  plot = save_figure(fig, output_dir, "length_extrapolation.png")
  numbers = {"factors": list(factors),
             "mean_loss": {f: c.mean(axis=0).tolist() for f, c in curves.items()}}
  return Analysis([verdict], [("Held-out loss vs evaluation length", table)], numbers, [plot])
