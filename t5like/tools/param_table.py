"""Prints the parameter-count table of the paper's ten configs (docs/architecture.md).

Usage: ``python -m t5like.tools.param_table``. Counts come from the analytic formula and from the
abstractly built model (``nnx.eval_shape``: shapes only, no memory), which must agree.
"""
from __future__ import annotations

from t5like.config.model import PAPER_SIZES, paper_model
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


if __name__ == "__main__":
  print(table())
