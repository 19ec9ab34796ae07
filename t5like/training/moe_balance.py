"""What a train step does with the MoE layers' statistics (docs/moe.md).

- the sequence-wise balance loss (weight ``moe.balance_loss``) and router z-loss
  (``moe.router_z_loss``) of every MoE layer join the loss;
- after the optimizer step, the auxiliary-loss-free balancing moves each layer's selection bias:
  ``b_i += gamma * sign(mean_j load_j - load_i)``, with the loads of the whole global batch (the
  step is one jitted program over the global batch, so the sum over data shards is XLA's and every
  host computes the same update);
- per-layer metrics: load max / mean, balance loss, z-loss, bias spread (max - min).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from t5like.config.moe import MoEConfig
from t5like.models.moe import BIAS_PATH, MoEStats

Stats = dict[tuple, MoEStats]  # Path of a layer stack -> its MoE layers' stats, [layers] leading.


def aux_loss(stats: Stats, cfg: MoEConfig) -> jax.Array:
  """Per-token auxiliary loss: sum over MoE layers of alpha * balance + z_weight * z-loss."""
  total = jnp.zeros((), jnp.float32)
  for s in stats.values():
    total += cfg.balance_loss * jnp.sum(s.balance_loss) + cfg.router_z_loss * jnp.sum(s.z_loss)
  return total


def _get(tree: Any, path: tuple) -> Any:
  for key in path:
    tree = tree[key]
  return tree


def updated_biases(model_state: Any, loads: Stats, gamma: float) -> Any:
  """``model_state`` with every stack's biases moved by gamma * sign(mean load - load)."""
  if not loads:
    return model_state
  new = jax.tree.map(lambda x: x, model_state)  # A copy whose dicts we may rebind.
  for path, s in loads.items():
    parent = _get(new, path + BIAS_PATH[:-1])
    bias_le = parent[BIAS_PATH[-1]]
    load_le = s.load
    step = gamma * jnp.sign(jnp.mean(load_le, axis=-1, keepdims=True) - load_le)
    parent[BIAS_PATH[-1]] = bias_le + step.astype(bias_le.dtype)
  return new


def layer_metrics(stats: Stats, model_state: Any, names: dict[tuple, list[str]],
                  num_micro: int, capacity: bool = False) -> dict[str, jax.Array]:
  """``moe/<encoder|decoder>/<layer>/{load_max_over_mean, balance_loss, z_loss, bias_spread}``
  (+ ``dropped_fraction`` with ``capacity``; ``names``: ``models.moe.moe_layer_names``);
  balance and z averaged over the microbatches."""
  out = {}
  for path, s in stats.items():
    bias_le = _get(model_state, path + BIAS_PATH)
    ratio = jnp.max(s.load, -1) / jnp.maximum(jnp.mean(s.load, -1), 1e-9)
    for i, name in enumerate(names[path]):
      key = f"moe/{name}"
      out[f"{key}/load_max_over_mean"] = ratio[i]
      out[f"{key}/balance_loss"] = s.balance_loss[i] / num_micro
      out[f"{key}/z_loss"] = s.z_loss[i] / num_micro
      out[f"{key}/bias_spread"] = jnp.max(bias_le[i]) - jnp.min(bias_le[i])
      if capacity:
        out[f"{key}/dropped_fraction"] = s.dropped[i] / jnp.maximum(jnp.sum(s.load[i]), 1.0)
  return out
