"""Adafactor (optax) with global-norm clipping, the paper's learning-rate schedules, and the
logical axes of the optimizer state (so it is sharded like the parameters it belongs to).

The update is ``-lr(step) * adafactor_direction(clip(grads))``. The learning rate is applied by
the train step from ``TrainState.step`` (the number of batches consumed) rather than inside
optax: the schedule then depends only on the step, also when a non-finite step was skipped, and
the logged learning rate is exactly the one used. Adafactor's own count (the ``t^-0.8`` decay)
advances only with applied updates.

Note on stacked layers: parameters of a layer stack are one ``[layers, ...]`` array. optax's
Adafactor factors the two largest dimensions (never ``layers`` at the paper's sizes), so the
second-moment estimate is per layer as in T5X; its update clipping (RMS of the update) and
parameter scale (RMS of the parameter) are computed over the whole stacked array, i.e. over all
layers together, where T5X computes them per layer.
"""
from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np
import optax

from t5like.config.train import TrainConfig

Axes = tuple[str | None, ...]


def learning_rate_schedule(cfg: TrainConfig) -> optax.Schedule:
  """docs/paper.md §1: linear warmup to the peak then cosine to ``final_lr_fraction``; or constant."""
  peak = cfg.learning_rate
  if cfg.schedule == "constant":
    return optax.constant_schedule(peak)
  decay = max(cfg.decay_steps or cfg.steps, cfg.warmup_steps + 1)
  end = peak * cfg.final_lr_fraction
  if cfg.warmup_steps == 0:
    return optax.cosine_decay_schedule(peak, decay_steps=decay, alpha=cfg.final_lr_fraction)
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=peak, warmup_steps=cfg.warmup_steps, decay_steps=decay,
      end_value=end)


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
  """Global-norm clipping, then Adafactor (decay 0.8, factored second moments), no lr yet."""
  parts = []
  if cfg.clip_grad_norm > 0:
    parts.append(optax.clip_by_global_norm(cfg.clip_grad_norm))
  parts.append(optax.adafactor(
      learning_rate=None,  # Applied by the train step: see the module docstring.
      min_dim_size_to_factor=cfg.adafactor_min_dim_to_factor,
      decay_rate=cfg.adafactor_decay_rate,
      decay_offset=0,
      multiply_by_parameter_scale=cfg.adafactor_scale_by_param_rms,
      clipping_threshold=cfg.adafactor_clipping_threshold or None,
      momentum=None,
  ))
  return optax.chain(*parts)


def factored_dims(shape: tuple[int, ...], min_dim: int) -> tuple[int, int] | None:
  """(second largest, largest) dims that Adafactor factors, or None (optax's rule)."""
  if len(shape) < 2:
    return None
  order = np.argsort(shape)
  if shape[order[-2]] < min_dim:
    return None
  return int(order[-2]), int(order[-1])


def _path_names(path) -> list[str]:
  out = []
  for k in path:
    name = getattr(k, "name", None)
    out.append(str(name) if name is not None else str(getattr(k, "key", getattr(k, "idx", k))))
  return out


def optimizer_state_axes(abstract_opt_state: Any, abstract_params: Any, param_axes: Any,
                         min_dim_to_factor: int) -> Any:
  """Logical axes for every leaf of the optimizer state.

  A leaf shaped like its parameter takes the parameter's axes; Adafactor's factored row/column
  statistics (``v_row`` drops the largest dimension, ``v_col`` the second largest) take the
  parameter's axes minus the reduced one; scalars and ``[1]`` placeholders are replicated. The
  parameter a leaf belongs to is found by its tree path, which ends with the parameter's path.
  """
  params = {}
  flat, treedef = jax.tree_util.tree_flatten_with_path(abstract_params)
  for (path, leaf), axes in zip(flat, treedef.flatten_up_to(param_axes)):
    params[tuple(path)] = (tuple(leaf.shape), tuple(axes))
  max_len = max((len(p) for p in params), default=0)

  def leaf_axes(path, leaf) -> Axes:
    shape = tuple(leaf.shape)
    path = tuple(path)
    for n in range(1, max_len + 1):
      if n > len(path) or path[-n:] not in params:
        continue
      p_shape, p_axes = params[path[-n:]]
      if shape == p_shape:
        return p_axes
      names = _path_names(path[:-n])
      dims = factored_dims(p_shape, min_dim_to_factor)
      if dims is not None and len(shape) == len(p_shape) - 1:
        d1, d0 = dims
        dropped = d0 if "v_row" in names else d1 if "v_col" in names else None
        if dropped is not None:
          axes = p_axes[:dropped] + p_axes[dropped + 1:]
          if shape == p_shape[:dropped] + p_shape[dropped + 1:]:
            return axes
      break
    return (None,) * len(shape)

  return jax.tree_util.tree_map_with_path(leaf_axes, abstract_opt_state)


def count_bytes(tree: Any) -> int:
  return sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))
