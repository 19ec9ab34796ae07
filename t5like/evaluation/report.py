"""``eval.py --suite`` report: markdown tables side by side per checkpoint, and PNGs."""
from __future__ import annotations

from typing import Any

from etils import epath

from t5like.evaluation.plots import figure_grid, save


def _table(header, rows) -> list[str]:
  fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
  return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
          + ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows] + [""])


def _names(results) -> dict[str, str]:
  return {p: f"{epath.Path(p).name} ({c['family']}, step {c['step']})"
          for p, c in results["checkpoints"].items()}


def _loss_over(length: dict, key: str) -> str:
  loss, tokens = length.get("loss", {}).get(key), length.get("tokens", {}).get(key)
  if loss is None:
    return "-"
  return f"{loss:.4g}" + (f" ({tokens:.0f})" if isinstance(tokens, (int, float)) else "")


def _missing(results, suite: str, names) -> list[str]:
  """Under a section: which checkpoints it leaves out, and why (the suite's error)."""
  return [f"*Not shown for {names[p]}: the {suite} suite failed ({c[suite]['error']}).*"
          for p, c in results["checkpoints"].items()
          if isinstance(c.get(suite), dict) and "error" in c[suite]] + [""]


def write_markdown(results: dict[str, Any]) -> str:
  names = _names(results)
  ck = results["checkpoints"]
  md = ["# Evaluation report", "", f"Suites: {', '.join(results['suites'])}.", ""]
  md += _table(("checkpoint", "path", "config sha256"),
               [(names[p], c["checkpoint"], c["config_sha256"][:12]) for p, c in ck.items()])
  failed = [(s, p, c[s]["error"]) for p, c in ck.items() for s in results["suites"]
            if isinstance(c.get(s), dict) and "error" in c[s]]
  if failed:
    md += ["**Failed suites** (their results are missing below):", ""] + [
        f"- {s} for {names[p]}: {e}" for s, p, e in failed] + [""]
  if "ppl" in results["suites"]:
    md += ["## Held-out loss (target halves, same tokens for both families)", "",
           "Mean cross-entropy in nats per target token over the `tokens` target tokens: the "
           "target half of each mid-split held-out chunk, in the first batches of the "
           "validation split (`--max_batches`). Other sample sizes give other numbers (the "
           "length table's x1 uses rows of 4; `eval.py` without `--suite` the whole split).", ""]
    md += _table(("checkpoint", "loss", "perplexity", "accuracy", "tokens"), [
        (names[p], c["ppl"].get("eval_loss", c["ppl"].get("error")),
         c["ppl"].get("eval_perplexity", "-"), c["ppl"].get("eval_accuracy", "-"),
         c["ppl"].get("eval_tokens", "-")) for p, c in ck.items()])
    md += _missing(results, "ppl", names)
  if "tasks" in results["suites"]:
    md += ["## Downstream tasks", ""]
    rows = []
    for p, c in ck.items():
      for task, per in c["tasks"].get("tasks", {}).items():
        for shot in (f"{k}-shot" for k in results["shots"]):
          m = per.get(shot, {})
          rows.append((names[p], task, shot, ", ".join(
              f"{k}={v:.3f}" if isinstance(v, float) else f"{k}: {v}" for k, v in m.items())))
      if "error" in c["tasks"]:
        rows.append((names[p], "-", "-", c["tasks"]["error"]))
    md += _table(("checkpoint", "task", "shots", "scores"), rows)
    if results.get("task_errors"):
      md += ["Task files that could not be read:", ""] + [
          f"- `{f}`: {e}" for f, e in results["task_errors"].items()] + [""]
  if "length" in results["suites"]:
    md += ["## Length extrapolation (held-out loss at k x the training length)", "",
           "Nats per target token, as above, over batches of 4 rows at each length (target "
           "tokens scored in parentheses).", ""]
    md += _table(("checkpoint",) + tuple(f"x{k}" for k in (1, 2, 4, 8)), [
        (names[p],) + tuple(_loss_over(c["length"], f"x{k}") for k in (1, 2, 4, 8))
        for p, c in ck.items()])
    md += _missing(results, "length", names)
  if "cost" in results["suites"]:
    md += ["## Inference cost (analytic forward FLOPs per sequence, docs/flops.md)", ""]
    rows = []
    for p, c in ck.items():
      for lengths, f in c["cost"].get("flops", {}).items():
        rows.append((names[p], lengths, f["prefill"], f["decode"], f["total"]))
    md += _table(("checkpoint", "input+output", "prefill", "decode", "total"), rows)
    md += _missing(results, "cost", names)
    measured = [(names[p], f"{m['batch']} x {m['input']}+{m['output']}", m["sequences_per_s"],
                 m["new_tokens_per_s"]) for p, c in ck.items()
                if isinstance(m := c["cost"].get("measured"), dict)]
    if measured:
      md += ["Measured with the KV cache (greedy, every row generating all tokens):", ""]
      md += _table(("checkpoint", "batch x input+output", "sequences/s", "new tokens/s"),
                   measured)
  if "attention" in results["suites"]:
    md += ["## Attention maps (mean over heads and held-out rows)", ""]
    rows = [(names[p], l["stack"], l["layer"], l["normalized_rank"],
             l["normalized_effective_rank"], l["dong_ratio"], l["mean_distance"])
            for p, c in ck.items() for l in c["attention"].get("layers", [])]
    md += _table(("checkpoint", "stack", "layer", "rank/len", "eff. rank/len", "Dong ratio",
                  "mean distance"), rows)
    md += [f"![{c['attention']['heatmaps']}]({c['attention']['heatmaps']})"
           for c in ck.values() if "heatmaps" in c.get("attention", {})] + [""]
    md += _missing(results, "attention", names)
  if "experts" in results["suites"]:
    md += ["## Expert assignment (MoE layers)", ""]
    rows = [(names[p], layer, f"{a['entropy']:.3f} / {a['max_entropy']:.3f}",
             ", ".join(f"{s}: {n}" for s, n in a["pairs"].items()))
            for p, c in ck.items() for layer, a in c["experts"].get("layers", {}).items()]
    md += _table(("checkpoint", "layer", "load entropy / max (nats)", "routed pairs"), rows)
    md += [f"![{c['experts']['heatmaps']}]({c['experts']['heatmaps']})"
           for c in ck.values() if "heatmaps" in c.get("experts", {})] + [""]
    md += _missing(results, "experts", names)
  md += [f"![{png}]({png})" for png in results.get("plots", [])]
  return "\n".join(md) + "\n"


def plots(results: dict[str, Any], output_dir: str) -> list[str]:
  """Length curves of every checkpoint, per-task grades with 95% intervals, and quality vs
  inference FLOPs when several checkpoints are given."""
  names, ck, out = _names(results), results["checkpoints"], []
  curves = {p: c["length"]["loss"] for p, c in ck.items() if "loss" in c.get("length", {})}
  if curves:
    fig, axes = figure_grid(1, 1, cell=4.0)
    ax = axes[0, 0]
    for p, curve in curves.items():
      ax.plot([1, 2, 4, 8], [curve[f"x{k}"] for k in (1, 2, 4, 8)], marker="o", label=names[p])
    ax.set_xscale("log", base=2)
    ax.set_xticks([1, 2, 4, 8], ["1x", "2x", "4x", "8x"])
    ax.set_xlabel("evaluation length / training length")
    ax.set_ylabel("held-out loss (nats / target token)")
    ax.legend(fontsize=7)
    out.append(epath.Path(save(fig, epath.Path(output_dir) / "length_extrapolation.png")).name)
  grades = task_grades(results)
  if grades:
    out.append(epath.Path(plot_task_grades(grades, {p: names[p] for p in ck},
                                           epath.Path(output_dir) / "tasks.png")).name)
  points = [(c["cost"]["flops"][next(iter(c["cost"]["flops"]))]["total"],
             c["ppl"]["eval_loss"], names[p]) for p, c in ck.items()
            if "flops" in c.get("cost", {}) and "eval_loss" in c.get("ppl", {})]
  if len(points) >= 2:
    fig, axes = figure_grid(1, 1, cell=4.0)
    ax = axes[0, 0]
    for f, loss, name in points:
      ax.scatter([f], [loss], label=name)
    lengths = next(iter(ck.values()))["cost"]["flops"]
    ax.set_xlabel(f"inference FLOPs per sequence ({next(iter(lengths))} tokens)", labelpad=14)
    ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 0))
    ax.xaxis.get_offset_text().set_fontsize(7)
    ax.set_ylabel("held-out loss (nats / target token, ppl table)")
    ax.legend(fontsize=7)
    out.append(epath.Path(save(fig, epath.Path(output_dir) / "quality_vs_cost.png")).name)
  return out


PRIMARY = ("multiple_choice_grade", "exact_str_match")  # The grade plotted for a task.


def task_grades(results: dict[str, Any]) -> dict[str, dict[str, tuple[float, float]]]:
  """``{"<task> <k>-shot": {checkpoint: (grade, 95% half-width)}}`` from the tasks suite; the
  half-width is 1.96 standard errors over the task's examples."""
  out: dict[str, dict[str, tuple[float, float]]] = {}
  for path, c in results["checkpoints"].items():
    for task, per in c.get("tasks", {}).get("tasks", {}).items():
      for k in results["shots"]:
        m = per.get(f"{k}-shot", {})
        metric = next((x for x in PRIMARY if x in m), None)
        if metric is not None:
          out.setdefault(f"{task} {k}-shot", {})[path] = (
              m[metric], 1.96 * m.get(f"{metric}_stderr", 0.0))
  return out


def plot_task_grades(grades: dict[str, dict[str, tuple[float, float]]], names: dict[str, str],
                     path) -> str:
  """Grouped bars: one group per task and shot count, one bar per checkpoint, 95% intervals."""
  import numpy as np
  fig, axes = figure_grid(1, 1, cell=max(4.0, 0.9 * len(grades)))
  ax = axes[0, 0]
  width = 0.8 / max(1, len(names))
  x = np.arange(len(grades))
  for i, (ckpt, name) in enumerate(names.items()):
    vals = [grades[g].get(ckpt, (np.nan, 0.0)) for g in grades]
    ax.bar(x + (i - (len(names) - 1) / 2) * width, [v for v, _ in vals], width,
           yerr=[e for _, e in vals], capsize=3, label=name)
  ax.set_xticks(x, list(grades), rotation=30, ha="right", fontsize=7)
  ax.set_ylim(0, 1.05)
  ax.set_ylabel("grade (95% interval over examples)")
  ax.legend(fontsize=7)
  return save(fig, path)
