"""Finding 1 (scaling): loss vs parameters and vs training compute, DecLLM against RedLLM.

Fits ``L = A x^-alpha`` per family against non-embedding parameters and against training FLOPs
(docs/flops.md), compares the exponents with the paper's, and judges four sub-claims by the rules
written in the experiment's criterion (configs/experiments/scaling.py):

- similar exponents vs FLOPs: the two confidence intervals overlap (else contradicted);
- the fit-based rules need scaling to be measurable: both exponents' intervals above 0, else
  'inconclusive' (tiny budgets);
- DecLLM more parameter-efficient / RedLLM more compute-efficient: at the geometric middle of the
  range both families cover, the fitted losses differ by more than twice the fits' combined
  residual spread (log scale), in the claimed direction (other direction: contradicted; within
  the spread: inconclusive);
- DecLLM dominates the compute-optimal frontier: more than half of the frontier's runs are DecLLM
  (fewer: contradicted; exactly half: inconclusive).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from t5like.experiments import fit
from t5like.experiments.report import Analysis, Verdict, markdown_table, new_figure, save_figure
from t5like.experiments.spec import ExperimentSpec

FAMILIES = ("decllm", "redllm")
PAPER_EXPONENTS = {"flops": {"decllm": 0.20, "redllm": 0.24},
                   "params": {"decllm": 0.17, "redllm": 0.18}}  # RedPajama, docs/paper.md.
AXES = {"params": ("non_embedding_params", "non-embedding parameters"),
        "flops": ("train_flops", "training FLOPs")}


def _points(results, family: str, key: str) -> tuple[np.ndarray, np.ndarray]:
  rows = [r for r in results.values() if r["family"] == family and r.get("eval_loss")]
  return (np.array([r[key] for r in rows], np.float64),
          np.array([r["eval_loss"] for r in rows], np.float64))


def _fits(results, confidence: float) -> dict[str, dict[str, fit.PowerLaw | str]]:
  fits: dict[str, dict[str, Any]] = {}
  for axis, (key, _) in AXES.items():
    for family in FAMILIES:
      x, y = _points(results, family, key)
      try:
        fits.setdefault(axis, {})[family] = fit.fit_power_law(x, y, confidence)
      except ValueError as e:
        fits.setdefault(axis, {})[family] = str(e)
  return fits


def _unusable(fa, fb) -> str:
  """Why two fits cannot be compared ("" if they can): a failed fit, or no measurable scaling."""
  for f in (fa, fb):
    if isinstance(f, str):
      return f"no fit: {f}"
  flat = [f for f in (fa, fb) if f.exponent_ci[0] <= 0]
  if flat:
    return ("no measurable scaling at this budget (an exponent's interval includes 0: "
            + ", ".join(f"{f.exponent:.3f} [{f.exponent_ci[0]:.3f}, {f.exponent_ci[1]:.3f}]"
                        for f in flat) + ")")
  return ""


def _efficiency(fits, results, axis: str, better: str, sigmas: float) -> Verdict:
  key, label = AXES[axis]
  other = "redllm" if better == "decllm" else "decllm"
  claim = f"{'DecLLM' if better == 'decllm' else 'RedLLM'} reaches a lower loss at equal {label}"
  fb, fo = fits[axis][better], fits[axis][other]
  why = _unusable(fb, fo)
  if why:
    return Verdict(claim, "inconclusive", why)
  xb, xo = _points(results, better, key)[0], _points(results, other, key)[0]
  lo, hi = max(xb.min(), xo.min()), min(xb.max(), xo.max())
  if lo > hi:
    return Verdict(claim, "inconclusive", f"the families' {label} ranges do not overlap")
  mid = math.sqrt(lo * hi)
  gap = float(np.log(fo.predict(mid)) - np.log(fb.predict(mid)))  # > 0: `better` is lower.
  noise = sigmas * math.hypot(fb.residual_std, fo.residual_std)
  verdict = "supported" if gap > noise else "contradicted" if gap < -noise else "inconclusive"
  return Verdict(claim, verdict, f"at {mid:.3g} {label}: log L_{other} - log L_{better} = "
                 f"{gap:+.4f} vs {sigmas:g}x combined residual std = {noise:.4f}")


def _exponents(fits) -> Verdict:
  claim = "Similar scaling exponents vs training FLOPs"
  d, r = fits["flops"]["decllm"], fits["flops"]["redllm"]
  why = _unusable(d, r)
  if why:
    return Verdict(claim, "inconclusive", why)
  ok = fit.intervals_overlap(d.exponent_ci, r.exponent_ci)
  return Verdict(claim, "supported" if ok else "contradicted",
                 f"DecLLM {d.exponent:.3f} [{d.exponent_ci[0]:.3f}, {d.exponent_ci[1]:.3f}], "
                 f"RedLLM {r.exponent:.3f} [{r.exponent_ci[0]:.3f}, {r.exponent_ci[1]:.3f}] "
                 f"({d.confidence:.0%} CIs {'overlap' if ok else 'do not overlap'})")


def _frontier(results) -> tuple[Verdict, list]:
  points = [(r["train_flops"], r["eval_loss"], r["family"]) for r in results.values()
            if r.get("eval_loss")]
  front = fit.pareto_frontier(points)
  dec = sum(p[2] == "decllm" for p in front)
  claim = "DecLLM dominates the compute-optimal frontier"
  verdict = ("supported" if 2 * dec > len(front) else
             "contradicted" if 2 * dec < len(front) else "inconclusive")
  return Verdict(claim, verdict, f"{dec} of {len(front)} frontier runs are DecLLM"), front


def _plot(results, fits, front, axis: str, output_dir: str) -> str:
  key, label = AXES[axis]
  fig, ax = new_figure()
  for family, color in zip(FAMILIES, ("tab:blue", "tab:orange")):
    x, y = _points(results, family, key)
    if not len(x):
      continue
    ax.scatter(x, y, color=color, label=family)
    f = fits[axis][family]
    if not isinstance(f, str):
      grid = np.geomspace(x.min(), x.max(), 50)
      ax.plot(grid, f.predict(grid), color=color,
              label=f"{family} fit: alpha={f.exponent:.3f} "
                    f"[{f.exponent_ci[0]:.3f}, {f.exponent_ci[1]:.3f}]")
  if axis == "flops" and front:
    ax.plot([p[0] for p in front], [p[1] for p in front], "k--", lw=1,
            label="compute-optimal frontier")
  ax.set_xscale("log")
  ax.set_yscale("log")
  from matplotlib.ticker import NullFormatter, ScalarFormatter
  ax.yaxis.set_major_formatter(ScalarFormatter())
  ax.yaxis.set_minor_formatter(NullFormatter())
  ax.set_xlabel(label)
  ax.set_ylabel("held-out loss (nats / target token)")
  ax.set_title(f"Scaling vs {label}")
  ax.legend(fontsize=7)
  return save_figure(fig, output_dir, f"scaling_vs_{axis}.png")


def analyse(spec: ExperimentSpec, results: dict[str, dict[str, Any]],
            output_dir: str) -> Analysis:
  confidence = spec.param("confidence", 0.95)
  sigmas = spec.param("sigmas", 2.0)
  fits = _fits(results, confidence)
  frontier_verdict, front = _frontier(results)
  verdicts = [_exponents(fits), _efficiency(fits, results, "params", "decllm", sigmas),
              _efficiency(fits, results, "flops", "redllm", sigmas), frontier_verdict]
  runs = sorted(results.values(), key=lambda r: (r["family"], r["params"], r["name"]))
  run_table = markdown_table(
      ("run", "family", "params", "non-emb params", "train FLOPs", "tokens", "held-out loss"),
      [(r["name"], r["family"], r["params"], r["non_embedding_params"], r["train_flops"],
        r["train_tokens"], r["eval_loss"]) for r in runs])
  fit_rows = []
  for axis in AXES:
    for family in FAMILIES:
      f = fits[axis][family]
      paper = PAPER_EXPONENTS[axis][family]
      if isinstance(f, str):
        fit_rows.append((axis, family, "-", "-", "-", paper))
      else:
        fit_rows.append((axis, family, f.exponent, f"[{f.exponent_ci[0]:.3f}, "
                         f"{f.exponent_ci[1]:.3f}]", f.r2, paper))
  fit_table = markdown_table(("vs", "family", "alpha", f"{confidence:.0%} CI", "R^2",
                              "paper alpha"), fit_rows)
  plots = [_plot(results, fits, front, axis, output_dir) for axis in AXES]
  numbers = {"fits": {axis: {fam: (f if isinstance(f, str) else f.to_dict())
                             for fam, f in by.items()} for axis, by in fits.items()},
             "frontier": [{"train_flops": c, "eval_loss": l, "family": fam}
                          for c, l, fam in front],
             "paper_exponents": PAPER_EXPONENTS}
  return Analysis(verdicts, [("Runs", run_table), ("Power-law fits", fit_table)], numbers, plots)
