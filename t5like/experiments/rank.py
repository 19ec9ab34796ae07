"""The rank argument on trained models: attention maps of each arm on the same held-out input
tokens (t5like.evaluation.attention_analysis), judged by the rule of
configs/experiments/attention_rank.py. Summaries are cached per run digest in the output dir."""
from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from etils import epath

from t5like.experiments.report import Analysis, Verdict, markdown_table, new_figure, save_figure
from t5like.experiments.spec import ExperimentSpec

INPUT_STACKS = ("decoder", "encoder")  # Self-attention over the input region.


def _summary(result: dict[str, Any], rows: int, output_dir: str) -> list[dict[str, Any]]:
  cache = epath.Path(output_dir) / "attention" / f"{result['name']}.json"
  if cache.exists():
    saved = json.loads(cache.read_text())
    if (saved.get("digest") == result["digest"] and saved.get("config") == result.get("config")
        and saved.get("rows") == rows):  # The same training (spec and resolved config).
      return saved["layers"]
  from t5like.evaluation import attention_analysis as aa
  from t5like.training.restore import restore_model
  model, cfg, _ = restore_model(result["workdir"], overrides=["data.objective=prefix"])
  maps = aa.attention_maps(model, aa.held_out_batch(cfg, rows))
  layers = aa.summarize(maps)
  cache.parent.mkdir(parents=True, exist_ok=True)
  cache.write_text(json.dumps({"digest": result["digest"], "config": result.get("config"),
                               "rows": rows, "layers": layers}))
  aa.plot_heads([m for m in maps if m.stack in INPUT_STACKS + ("cross",)][:3],
                epath.Path(output_dir) / f"heads_{result['name']}.png",
                title=f"{result['name']}: input self-attention (and cross) maps, row 0")
  return layers


def _per_row(layers, key: str) -> np.ndarray:
  """Mean over the input self-attention layers of a per-row quantity."""
  per = [l[f"{key}_per_row"] for l in layers if l["stack"] in INPUT_STACKS]
  return np.mean(np.asarray(per, np.float64), axis=0)


def analyse(spec: ExperimentSpec, results: dict[str, dict[str, Any]],
            output_dir: str) -> Analysis:
  rows = spec.param("rows", 4)
  sigmas = spec.param("sigmas", 2.0)
  by_arm: dict[str, dict[str, Any]] = {}
  for r in sorted(results.values(), key=lambda r: r["name"]):
    layers = _summary(r, rows, output_dir)
    arm = by_arm.setdefault(r["tags"]["arm"], {"kind": r["tags"]["kind"], "eff": [], "num": [],
                                               "tri": [], "layers": []})
    arm["eff"].extend(_per_row(layers, "normalized_effective_rank").tolist())
    arm["num"].extend(_per_row(layers, "normalized_rank").tolist())
    arm["tri"].extend(l["triangular_full_rank_fraction"] for l in layers
                      if l["stack"] in INPUT_STACKS)
    arm["layers"].append(layers)
  verdicts = []
  causal = by_arm.get("decllm_causal")
  for name, arm in by_arm.items():
    if arm["kind"] != "bidirectional":
      continue
    claim = f"{name}: bidirectional maps have lower rank than causal maps"
    if causal is None:
      verdicts.append(Verdict(claim, "inconclusive", "no causal arm finished"))
      continue
    a, c = np.asarray(arm["eff"]), np.asarray(causal["eff"])
    d = float(a.mean() - c.mean())
    if len(a) < 2 or len(c) < 2:
      verdicts.append(Verdict(claim, "inconclusive", f"d = {d:+.4f} with too few rows"))
      continue
    noise = sigmas * math.sqrt(a.var(ddof=1) / len(a) + c.var(ddof=1) / len(c))
    v = "supported" if d < -noise else "contradicted" if d > noise else "inconclusive"
    verdicts.append(Verdict(claim, v, f"effective rank / length: {a.mean():.3f} vs causal "
                            f"{c.mean():.3f}, d = {d:+.4f} vs noise {noise:.4f} "
                            f"({len(a)}/{len(c)} rows)"))
  for name, arm in by_arm.items():
    if arm["kind"] in ("causal", "mixed"):
      frac = float(np.mean(arm["tri"])) if arm["tri"] else 0.0
      verdicts.append(Verdict(f"{name}: every input map triangular with a full diagonal",
                              "supported" if frac == 1.0 else "contradicted",
                              f"{frac:.0%} of (layer, head, row) maps exactly full rank"))
  table = markdown_table(
      ("arm", "attention", "rows", "effective rank / len", "numerical rank / len",
       "exactly full rank", "Dong ratio per layer"),
      [(n, a["kind"], len(a["eff"]), float(np.mean(a["eff"])), float(np.mean(a["num"])),
        f"{np.mean(a['tri']):.0%}" if a["tri"] else "-",
        ", ".join(f"{np.mean([ls[i]['dong_ratio'] for ls in a['layers']]):.3f}"
                  for i in range(len(a["layers"][0])))) for n, a in by_arm.items()])
  fig, ax = new_figure()
  names = list(by_arm)
  ax.bar(range(len(names)), [np.mean(by_arm[n]["eff"]) for n in names],
         yerr=[np.std(by_arm[n]["eff"]) for n in names], color="tab:blue")
  ax.set_xticks(range(len(names)), names, rotation=20, fontsize=7)
  ax.set_ylabel("effective rank / length (input self-attention)")
  ax.set_title("Attention-map rank by attention kind")
  plot = save_figure(fig, output_dir, "attention_rank.png")
  heads = sorted(p.name for p in epath.Path(output_dir).glob("heads_*.png"))
  numbers = {n: {k: a[k] for k in ("kind", "eff", "num", "tri", "layers")}
             for n, a in by_arm.items()}
  return Analysis(verdicts, [("Input self-attention maps", table)], numbers, [plot] + heads)
