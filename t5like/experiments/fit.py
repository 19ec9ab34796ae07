"""Power-law fits with confidence intervals, and the compute-optimal frontier.

A scaling law ``L = A * x^(-alpha)`` is a straight line in log-log space,
``log L = log A - alpha * log x``; ordinary least squares on the logs gives ``alpha`` and its
standard error, and the Student-t quantile with ``n - 2`` degrees of freedom turns that into a
confidence interval (the paper reports exponents of this form: DecLLM 0.20 / RedLLM 0.24 vs
training FLOPs on RedPajama; see docs/paper.md).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np
from scipy import stats


@dataclasses.dataclass(frozen=True)
class PowerLaw:
  """``L = coef * x^(-exponent)`` fitted on ``n`` points."""

  exponent: float  # alpha (positive when the loss falls with x).
  coef: float  # A.
  exponent_ci: tuple[float, float]  # Two-sided confidence interval of alpha.
  confidence: float  # Level of that interval, e.g. 0.95.
  r2: float  # Coefficient of determination of the log-log fit.
  n: int  # Points fitted.
  residual_std: float  # Std of the log-loss residuals (natural log).

  def predict(self, x: float | np.ndarray) -> np.ndarray:
    return self.coef * np.power(np.asarray(x, np.float64), -self.exponent)

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


def fit_power_law(x: Sequence[float], loss: Sequence[float], confidence: float = 0.95) -> PowerLaw:
  """Least-squares fit of ``log loss = log A - alpha log x``; needs >= 3 distinct positive x."""
  lx = np.log(np.asarray(x, np.float64))
  ly = np.log(np.asarray(loss, np.float64))
  if lx.shape != ly.shape or lx.ndim != 1:
    raise ValueError(f"x and loss must be 1-D of equal length, got {lx.shape} and {ly.shape}")
  if len(np.unique(lx)) < 3 or not (np.all(np.isfinite(lx)) and np.all(np.isfinite(ly))):
    raise ValueError("a power-law fit with a confidence interval needs >= 3 distinct, positive, "
                     f"finite x values and finite positive losses; got x={list(x)} "
                     f"loss={list(loss)}")
  n = len(lx)
  design = np.stack([np.ones(n), lx], axis=1)
  (intercept, slope), *_ = np.linalg.lstsq(design, ly, rcond=None)
  resid = ly - (intercept + slope * lx)
  dof = n - 2
  sigma2 = float(resid @ resid) / dof if dof > 0 else 0.0
  se_slope = math.sqrt(sigma2 / float(((lx - lx.mean()) ** 2).sum()))
  half = float(stats.t.ppf(0.5 + confidence / 2, dof)) * se_slope if dof > 0 else math.inf
  total = float(((ly - ly.mean()) ** 2).sum())
  r2 = 1.0 - float(resid @ resid) / total if total > 0 else 1.0
  alpha = -float(slope)
  return PowerLaw(exponent=alpha, coef=math.exp(float(intercept)),
                  exponent_ci=(alpha - half, alpha + half), confidence=confidence, r2=r2, n=n,
                  residual_std=math.sqrt(sigma2))


def intervals_overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
  return a[0] <= b[1] and b[0] <= a[1]


def pareto_frontier(points: Sequence[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
  """Points (cost, loss, label) not beaten by any cheaper-or-equal point with a lower loss.

  The compute-optimal frontier: walking up in cost, a point is on it when its loss is below every
  loss seen at a lower cost.
  """
  frontier, best = [], math.inf
  for cost, loss, label in sorted(points, key=lambda p: (p[0], p[1])):
    if loss < best:
      frontier.append((cost, loss, label))
      best = loss
  return frontier
