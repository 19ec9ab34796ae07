"""Adafactor (optax) with global-norm clipping, the paper's learning-rate schedules, and the
logical axes of the optimizer state (so it is sharded like the parameters it belongs to).

The update is ``-lr(step) * adafactor_direction(clip(grads))``. The learning rate is applied by
the train step from ``TrainState.step`` (the number of batches consumed) rather than inside
optax: the schedule then depends only on the step, also when a non-finite step was skipped, and
the logged learning rate is exactly the one used. Adafactor's own count (the ``t^-0.8`` decay)
advances only with applied updates.

Stacked layers: the parameters of a layer stack are one ``[layers, ...]`` array. optax's
Adafactor factors the two largest dimensions (never ``layers`` at the paper's sizes), so its
second-moment estimate is already per layer; its update clipping (RMS of the update) and
parameter scale (RMS of the parameter) would be computed over the whole stacked array. With
``train.adafactor_per_layer`` (the default) those two stateless steps run per layer instead
(optax's own transforms under ``jax.vmap`` over ``layers``), as T5X does for scanned layers:
a 24-layer DecLLM stack and a 12+12-layer RedLLM then take the same step per layer. The
optimizer state is the same pytree either way, so checkpoints do not depend on the choice.
"""
from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np
import optax

from t5like.config.train import TrainConfig

Axes = tuple[str | None, ...]


def factored_dims(shape: tuple[int, ...], min_dim: int) -> tuple[int, int] | None:
  """(second largest, largest) dims that Adafactor factors, or None: optax's rule (its
  ``_factored_dims`` is private), to name the axes of the factored statistics."""
  if len(shape) < 2:
    return None
  order = np.argsort(shape)
  if shape[order[-2]] < min_dim:
    return None
  return int(order[-2]), int(order[-1])


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


def stacked_leaves(param_axes: Any) -> Any:
  """True for each parameter whose logical axes start with ``layers`` (a stacked layer array)."""
  return jax.tree.map(lambda axes: bool(axes) and axes[0] == "layers", param_axes,
                      is_leaf=lambda x: isinstance(x, tuple))


def per_layer(inner: optax.GradientTransformation, stacked: Any) -> optax.GradientTransformation:
  """``inner`` (a stateless per-array transform) applied to each layer of the stacked leaves.

  ``stacked`` is a pytree of bools shaped like the parameters. optax has no per-slice variant
  of its block-RMS transforms, hence this vmap; unstacked leaves go to ``inner`` unchanged.
  """
  def update_fn(updates, state, params=None):
    def apply(u, p):  # One array, or under vmap one layer of it.
      return inner.update(u, state, p)[0]

    def one(u, p, is_stacked):
      return jax.vmap(apply)(u, p) if is_stacked else apply(u, p)

    if params is None:  # clip_by_block_rms needs no parameters.
      return jax.tree.map(lambda u, s: one(u, None, s), updates, stacked), state
    return jax.tree.map(one, updates, params, stacked), state

  return optax.GradientTransformation(inner.init, update_fn)


def make_optimizer(cfg: TrainConfig, param_axes: Any = None) -> optax.GradientTransformation:
  """Global-norm clipping, then Adafactor (decay 0.8, factored second moments), no lr yet.

  ``param_axes`` (the parameters' logical axes) marks the stacked ``[layers, ...]`` arrays for
  ``cfg.adafactor_per_layer``; without it every array is one block (optax's behaviour).
  """
  parts = []
  if cfg.clip_grad_norm > 0:
    parts.append(optax.clip_by_global_norm(cfg.clip_grad_norm))
  stacked = (stacked_leaves(param_axes) if cfg.adafactor_per_layer and param_axes is not None
             else None)
  blockwise = (lambda tx: per_layer(tx, stacked)) if stacked is not None else (lambda tx: tx)
  # optax.adafactor(learning_rate=None, momentum=None) step by step, so that the two block-RMS
  # steps can run per layer (optax has no per-slice block RMS, hence ``per_layer``); the chain
  # (and so the state pytree) is the same as optax's.
  ada = [optax.scale_by_factored_rms(factored=True, decay_rate=cfg.adafactor_decay_rate,
                                     step_offset=0,
                                     min_dim_size_to_factor=cfg.adafactor_min_dim_to_factor)]
  if cfg.adafactor_clipping_threshold:
    ada.append(blockwise(optax.clip_by_block_rms(cfg.adafactor_clipping_threshold)))
  if cfg.adafactor_scale_by_param_rms:
    ada.append(blockwise(optax.scale_by_param_block_rms()))
  ada.append(optax.scale(-1))
  parts.append(optax.chain(*ada))
  return optax.chain(*parts)


# Adafactor settings a resumed run should keep, each with the value a checkpoint saved before the
# setting existed was trained with (None: such a checkpoint is not compared).
ADAFACTOR_SETTINGS = {"adafactor_decay_rate": None, "adafactor_clipping_threshold": None,
                      "adafactor_scale_by_param_rms": None, "adafactor_per_layer": False}


def changed_settings(saved_config: dict, cfg: TrainConfig) -> list[str]:
  """The Adafactor settings of ``cfg`` that differ from those a checkpoint was trained with."""
  saved = (saved_config or {}).get("train")
  if not isinstance(saved, dict):
    return []
  out = []
  for name, before in ADAFACTOR_SETTINGS.items():
    was, now = saved.get(name, before), getattr(cfg, name)
    if was is not None and was != now:
      out.append(f"train.{name}: checkpoint {was!r} vs config {now!r}")
  return out


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
