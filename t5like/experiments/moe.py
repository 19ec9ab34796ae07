"""DecLLM vs RedLLM, dense and with MoE feed-forwards at equal active parameters: does the sign
of the held-out loss difference survive, after pretraining and after instruction tuning
(configs/experiments/moe.py)?"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from t5like.experiments.instruct import task_mean
from t5like.experiments.report import Analysis, Verdict, markdown_table, new_figure, save_figure
from t5like.experiments.spec import ExperimentSpec

STAGES = {"pretrain": "pretraining (held-out loss, prefix-LM split)",
          "finetune": "after instruction tuning (held-out FLAN loss)"}


def _arms(results, stage: str) -> dict[tuple[str, str], list[dict[str, Any]]]:
  """The finished runs of one stage by (family, feed-forward)."""
  arms: dict[tuple[str, str], list[dict[str, Any]]] = {}
  for r in results.values():
    if r["tags"].get("stage", "pretrain") == stage and r.get("eval_loss") is not None:
      arms.setdefault((r["tags"]["family"], r["tags"]["ffn"]), []).append(r)
  return arms


def _stats(rows: list[dict[str, Any]]) -> tuple[float, float, int]:
  a = np.asarray([r["eval_loss"] for r in rows], np.float64)
  return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else math.nan, len(a)


def _difference(arms, ffn: str, sigmas: float) -> tuple[float, float, bool]:
  """(RedLLM - DecLLM mean loss, its noise, whether both arms have >= 2 seeds)."""
  (mr, sr, nr), (md, sd, nd) = _stats(arms[("redllm", ffn)]), _stats(arms[("decllm", ffn)])
  enough = nr >= 2 and nd >= 2
  noise = sigmas * math.sqrt(sr ** 2 / nr + sd ** 2 / nd) if enough else math.nan
  return mr - md, noise, enough


def judge(arms, sigmas: float, stage: str = "pretrain") -> Verdict:
  claim = (f"{STAGES[stage]}: the RedLLM - DecLLM loss difference has the same sign with MoE as "
           "dense")
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


def _plot(arms, stage: str, output_dir: str) -> str:
  """Mean loss per family, dense and MoE bars side by side (error bars: seed std)."""
  fig, ax = new_figure()
  for i, ffn in enumerate(("dense", "moe")):
    fams = [f for f in ("decllm", "redllm") if (f, ffn) in arms]
    ax.bar(np.arange(len(fams)) + 0.35 * i, [_stats(arms[f, ffn])[0] for f in fams], width=0.33,
           yerr=[np.nan_to_num(_stats(arms[f, ffn])[1]) for f in fams], label=ffn)
    ax.set_xticks(np.arange(len(fams)) + 0.17, fams)
  ax.set_ylabel("held-out " + ("FLAN " if stage == "finetune" else "") +
                "loss (nats / target token)")
  ax.set_title(f"DecLLM vs RedLLM, dense and MoE (equal active params)\n{STAGES[stage]}",
               fontsize=10)
  if arms:
    ax.set_ylim(bottom=0.95 * min(r["eval_loss"] for rows in arms.values() for r in rows))
  ax.legend(fontsize=8)
  return save_figure(fig, output_dir, "moe.png" if stage == "pretrain" else f"moe_{stage}.png")


def analyse(spec: ExperimentSpec, results: dict[str, dict[str, Any]],
            output_dir: str) -> Analysis:
  sigmas = spec.param("sigmas", 2.0)
  verdicts, tables, plots, numbers = [], [], [], {}
  for stage, title in STAGES.items():
    arms = _arms(results, stage)
    verdicts.append(judge(arms, sigmas, stage))
    rows = []
    for (f, ffn), runs in sorted(arms.items()):
      mean, std, n = _stats(runs)
      rows.append((f, ffn, n, mean, std) + ((task_mean(runs),) if stage == "finetune" else ()))
    header = ("family", "feed-forward", "seeds", "mean held-out loss", "std")
    if stage == "finetune":
      header += ("0-shot task score (reported, not in the rule)",)
    tables.append((title[0].upper() + title[1:], markdown_table(header, rows)))
    plots.append(_plot(arms, stage, output_dir))
    numbers[stage] = {f"{f}/{ffn}": dict(zip(("mean", "std", "n"), _stats(runs)))
                      for (f, ffn), runs in arms.items()}
  return Analysis(verdicts, tables, numbers, plots)
