"""DecLLM vs RedLLM, dense and with MoE feed-forwards at equal active parameters: does the sign
of the held-out loss difference survive (configs/experiments/moe.py)?"""
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
      arms.setdefault((r["tags"]["family"], r["tags"]["ffn"]), []).append(r["eval_loss"])
  return arms


def _stats(losses: list[float]) -> tuple[float, float, int]:
  a = np.asarray(losses, np.float64)
  return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else math.nan, len(a)


def _difference(arms, ffn: str, sigmas: float) -> tuple[float, float, bool]:
  """(RedLLM - DecLLM mean loss, its noise, whether both arms have >= 2 seeds)."""
  (mr, sr, nr), (md, sd, nd) = _stats(arms[("redllm", ffn)]), _stats(arms[("decllm", ffn)])
  enough = nr >= 2 and nd >= 2
  noise = sigmas * math.sqrt(sr ** 2 / nr + sd ** 2 / nd) if enough else math.nan
  return mr - md, noise, enough


def judge(arms, sigmas: float) -> Verdict:
  claim = "the RedLLM - DecLLM held-out loss difference has the same sign with MoE as dense"
  if any(k not in arms for k in (("decllm", "dense"), ("decllm", "moe"), ("redllm", "dense"),
                                 ("redllm", "moe"))):
    return Verdict(claim, "inconclusive", "an arm has no finished run")
  (dd, nd, ok_d), (dm, nm, ok_m) = _difference(arms, "dense", sigmas), _difference(
      arms, "moe", sigmas)
  detail = f"d_dense = {dd:+.4f} (noise {nd:.4f}), d_moe = {dm:+.4f} (noise {nm:.4f})"
  if not (ok_d and ok_m):
    return Verdict(claim, "inconclusive", detail + "; the rule needs >= 2 seeds per arm")
  if abs(dd) > nd and abs(dm) > nm:
    return Verdict(claim, "supported" if dd * dm > 0 else "contradicted", detail)
  return Verdict(claim, "inconclusive", detail)


def analyse(spec: ExperimentSpec, results: dict[str, dict[str, Any]],
            output_dir: str) -> Analysis:
  arms = _arms(results)
  verdict = judge(arms, spec.param("sigmas", 2.0))
  rows = []
  for (f, ffn), losses in sorted(arms.items()):
    mean, std, n = _stats(losses)
    rows.append((f, ffn, n, mean, std))
  table = markdown_table(("family", "feed-forward", "seeds", "mean held-out loss", "std"), rows)
  fig, ax = new_figure()
  for i, ffn in enumerate(("dense", "moe")):
    fams = [f for f in ("decllm", "redllm") if (f, ffn) in arms]
    ax.bar(np.arange(len(fams)) + 0.35 * i, [_stats(arms[f, ffn])[0] for f in fams], width=0.33,
           yerr=[np.nan_to_num(_stats(arms[f, ffn])[1]) for f in fams], label=ffn)
    ax.set_xticks(np.arange(len(fams)) + 0.17, fams)
  ax.set_ylabel("held-out loss (nats / target token)")
  ax.set_title("DecLLM vs RedLLM, dense and MoE (equal active parameters)")
  if arms:
    ax.set_ylim(bottom=0.95 * min(min(v) for v in arms.values()))
  ax.legend(fontsize=8)
  plot = save_figure(fig, output_dir, "moe.png")
  numbers = {"arms": {f"{f}/{ffn}": dict(zip(("mean", "std", "n"), _stats(l)))
                      for (f, ffn), l in arms.items()}}
  return Analysis([verdict], [("Held-out loss per arm", table)], numbers, [plot])
