"""Writes an experiment's ``results.json``, ``report.md`` and plots (matplotlib, Agg backend)."""
from __future__ import annotations

import dataclasses
import datetime
import json
from typing import Any, Sequence

from etils import epath

from t5like.experiments.spec import ExperimentSpec

VERDICTS = ("supported", "contradicted", "inconclusive")


@dataclasses.dataclass
class Verdict:
  """The outcome of one criterion: the numbers it looked at and what they say."""

  claim: str  # The sub-claim judged.
  verdict: str  # One of VERDICTS (at this scale).
  evidence: str  # The measured numbers the rule compared, in words.

  def __post_init__(self):
    if self.verdict not in VERDICTS:
      raise ValueError(f"verdict {self.verdict!r} is not one of {VERDICTS}")


@dataclasses.dataclass
class Analysis:
  """What an analysis module returns."""

  verdicts: list[Verdict]  # One per sub-claim.
  tables: list[tuple[str, str]]  # (title, markdown table).
  numbers: dict[str, Any]  # Everything computed (fits, frontier, ...), for results.json.
  plots: list[str] = dataclasses.field(default_factory=list)  # PNG file names in output_dir.


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
  def cell(v):
    if isinstance(v, float):
      return f"{v:.4g}"
    return str(v)
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
  return "\n".join(lines)


def write_report(spec: ExperimentSpec, results: dict[str, dict[str, Any]], analysis: Analysis,
                 output_dir: str) -> dict[str, str]:
  """Writes results.json and report.md into ``output_dir``; returns their paths."""
  out = epath.Path(output_dir)
  out.mkdir(parents=True, exist_ok=True)
  blob = {"experiment": spec.name, "budget": spec.budget, "claim": spec.claim,
          "criterion": spec.criterion, "scale_note": spec.scale_note,
          "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "verdicts": [dataclasses.asdict(v) for v in analysis.verdicts],
          "analysis": analysis.numbers, "runs": results, "plots": analysis.plots}
  (out / "results.json").write_text(json.dumps(blob, indent=2, sort_keys=True, default=str))
  md = [f"# Experiment `{spec.name}` ({spec.budget} budget)", "",
        f"**Claim.** {spec.claim}", "", f"**Criterion (fixed before the runs).** {spec.criterion}",
        ""]
  if spec.scale_note:
    md += [f"**Scale.** {spec.scale_note}", ""]
  md += ["## Verdicts", "", markdown_table(
      ("claim", "verdict at this scale", "evidence"),
      [(v.claim, f"**{v.verdict}**", v.evidence) for v in analysis.verdicts]), ""]
  for title, table in analysis.tables:
    md += [f"## {title}", "", table, ""]
  for png in analysis.plots:
    md += [f"![{png}]({png})", ""]
  md += ["Every number is in `results.json`; each run's workdir (checkpoints, metrics, "
         "TensorBoard) is under `runs/`."]
  (out / "report.md").write_text("\n".join(md) + "\n")
  return {"results": str(out / "results.json"), "report": str(out / "report.md")}


def new_figure():
  """A matplotlib figure on the file-only Agg backend (no display needed)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt.subplots(figsize=(6, 4.2), dpi=110)


def save_figure(fig, output_dir: str, name: str) -> str:
  import matplotlib.pyplot as plt
  fig.tight_layout()
  with (epath.Path(output_dir) / name).open("wb") as f:
    fig.savefig(f, format="png")
  plt.close(fig)
  return name
