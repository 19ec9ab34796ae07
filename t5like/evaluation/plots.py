"""Figures for evaluation reports: matplotlib on the file-only Agg backend, any path or URI."""
from __future__ import annotations

import numpy as np
from etils import epath


def figure_grid(rows: int, cols: int, cell: float = 1.8):
  """A figure with a [rows, cols] array of axes."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(rows, cols, figsize=(cell * cols + 0.5, cell * rows + 0.5), dpi=100,
                           squeeze=False)
  return fig, np.asarray(axes)


def save(fig, path, tight: bool = True) -> str:
  """Writes ``fig`` as PNG to ``path`` (local or a URI such as gs://) and closes it; ``tight``:
  lays it out first (False: the caller did, e.g. around a colour bar)."""
  import matplotlib.pyplot as plt
  if tight:
    fig.tight_layout()
  with epath.Path(path).open("wb") as f:
    fig.savefig(f, format="png")
  plt.close(fig)
  return str(path)
