"""Tolerances that hold on every x86 CPU.

XLA:CPU picks vector paths and reduction orders per processor, so two float32 computations of the
same quantity that differ only in summation order (scan vs unrolled, 1 vs 4 microbatches, 1 vs 8
devices, remat) agree to a few ulps *of the largest terms summed*, not of each element: an entry
near zero next to entries near 1 can differ by 1e-6 absolutely and by 1e-3 relatively. Comparing
each array against its own scale, ``max|a - b| <= rel * max|b|``, is right by construction: with
float32's eps = 1.2e-7, ``rel = 1e-4`` leaves ~800 ulps of the array's scale for reordering, while
any real bug (a wrong mask, layer or position) moves values by a sizeable fraction of that scale.
Bit-identical claims (same executable, same machine) keep using ``assert_array_equal``.
"""
from __future__ import annotations

import jax
import numpy as np

FLOAT32_REORDER_REL = 1e-4  # Relative to the array's largest magnitude; see the module docstring.


def assert_close_to_scale(actual, desired, rel: float = FLOAT32_REORDER_REL,
                          err_msg: str = "") -> None:
  """``max|actual - desired| <= rel * max|desired|`` (exact equality for an all-zero array)."""
  a = np.asarray(actual, np.float64)
  d = np.asarray(desired, np.float64)
  assert a.shape == d.shape, f"{err_msg}: shapes {a.shape} != {d.shape}"
  scale = float(np.max(np.abs(d))) if d.size else 0.0
  err = float(np.max(np.abs(a - d))) if d.size else 0.0
  assert np.all(np.isfinite(a)) == np.all(np.isfinite(d)), f"{err_msg}: non-finite mismatch"
  assert err <= rel * scale, (
      f"{err_msg}: max|a-b| = {err:.3e} > {rel:g} * max|b| = {rel * scale:.3e}")


def assert_trees_close_to_scale(actual, desired, rel: float = FLOAT32_REORDER_REL) -> None:
  """``assert_close_to_scale`` leaf by leaf (each leaf against its own scale), naming the leaf."""
  flat_a = jax.tree_util.tree_flatten_with_path(actual)[0]
  flat_d = jax.tree.leaves(desired)
  assert len(flat_a) == len(flat_d), "trees differ in structure"
  for (path, a), d in zip(flat_a, flat_d):
    assert_close_to_scale(a, d, rel, jax.tree_util.keystr(path))
