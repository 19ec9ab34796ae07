"""Prints the parameter-count table of the paper's ten configs (docs/architecture.md).

Usage: ``python -m t5like.tools.param_table``. Counts come from the analytic formula and from the
abstractly built model (``nnx.eval_shape``: shapes only, no memory), which must agree. A second
table gives the paper-scale MoE variants (``configs/*_moe.py``): total and active parameters.
"""
from __future__ import annotations

import dataclasses

from t5like.config.model import PAPER_SIZES, paper_model
from t5like.config.moe import paper_moe
from t5like.models.param_count import analytic_param_count, built_param_count


def table() -> str:
  rows = ["| paper size | family | d | heads | layers (enc/dec) | analytic | built (abstract) |",
          "|---|---|---|---|---|---|---|"]
  for size in PAPER_SIZES:
    for family in ("decllm", "redllm"):
      cfg = paper_model(family, size)
      layers = (str(cfg.num_layers) if family == "decllm"
                else f"{cfg.num_encoder_layers}/{cfg.num_decoder_layers}")
      analytic, built = analytic_param_count(cfg), built_param_count(cfg)
      assert analytic == built, (family, size, analytic, built)
      rows.append(f"| {size.upper()} | {family} | {cfg.d_model} | {cfg.num_heads} | {layers} | "
                  f"{analytic:,} ({analytic / 1e9:.2f}B) | {built:,} |")
  return "\n".join(rows)


MOE_SIZES = ("1b", "8b")


def moe_table() -> str:
  """Total and active (per token: top-K routed + shared experts) parameters of the MoE configs."""
  rows = ["| active size | family | routed experts (width, top-K) + shared | total (analytic = "
          "built) | active | dense model |", "|---|---|---|---|---|---|"]
  for size in MOE_SIZES:
    for family in ("decllm", "redllm"):
      dense = paper_model(family, size)
      cfg = dataclasses.replace(dense, moe=paper_moe(dense.d_ff)).validate()
      total, built = analytic_param_count(cfg), built_param_count(cfg)
      assert total == built, (family, size, total, built)
      active = analytic_param_count(cfg, active=True)
      m = cfg.moe
      rows.append(f"| {size.upper()} | {family} | {m.num_experts} ({m.expert_d_ff}, top-{m.top_k})"
                  f" + {m.num_shared_experts} | {total / 1e9:.2f}B | {active / 1e9:.2f}B | "
                  f"{analytic_param_count(dense) / 1e9:.2f}B |")
  return "\n".join(rows)


if __name__ == "__main__":
  print(table())
  print()
  print(moe_table())
