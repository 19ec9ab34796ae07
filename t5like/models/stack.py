"""A stack of identical layers whose parameters are stacked on a leading ``layers`` axis.

The stack runs either under ``lax.scan`` (one compiled layer, the default for real sizes) or as a
Python loop over the same stacked parameters: both read one checkpoint format, so a model saved
scanned restores unrolled and vice versa. Each layer may be rematerialised by a named policy.
``unstacked`` gives the same layers as separate modules (generation's decode step: slicing the
stacked weights inside every step would copy them once per token).
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from t5like import ops
from t5like.config.model import ModelConfig
from t5like.models.blocks import CrossContext, SelfContext
from t5like.models.layers import fold

Cache = Any  # Per layer, what the layer's block takes as ``cache`` (a tuple over layers).


def remat_policy(name: str):
  """Maps ``ModelConfig.remat_policy`` to a ``jax.checkpoint`` policy (None = no remat)."""
  cp = jax.checkpoint_policies
  return {
      "none": None,
      "full": cp.nothing_saveable,
      "dots": cp.checkpoint_dots,
      "dots_no_batch": cp.save_from_both_policies(
          cp.dots_with_no_batch_dims_saveable, cp.save_only_these_names(*ops.SAVED_NAMES)),
      "attention_out": cp.save_only_these_names("attention_out"),
  }[name]


class LayerStack(nnx.Module):

  def __init__(self, make_layer: Callable[[nnx.Rngs], nnx.Module], num_layers: int,
               cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.num_layers = num_layers
    self.scan = cfg.scan_layers
    self.remat = cfg.remat_policy

    @nnx.split_rngs(splits=num_layers)
    @nnx.vmap(in_axes=0, out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
    def create(r: nnx.Rngs) -> nnx.Module:
      return make_layer(r)

    self.layers = create(rngs)

  def __call__(self, x_btd: jax.Array, ctx: SelfContext, *, rng: jax.Array | None = None,
               cross: CrossContext | None = None, cache: tuple[Cache, ...] | None = None
               ) -> tuple[jax.Array, tuple[Cache, ...] | None]:
    """Runs every layer; ``cache`` (one entry per layer, or None) comes back updated."""
    graphdef, params = nnx.split(self.layers)

    def body(x, xs):
      layer_params, i, layer_cache = xs
      layer = nnx.merge(graphdef, layer_params)
      return layer(x, ctx, i, fold(rng, i), cross, layer_cache)

    if self.remat != "none":
      body = jax.checkpoint(body, policy=remat_policy(self.remat), prevent_cse=not self.scan)
    idx = jnp.arange(self.num_layers)
    if self.scan:
      stacked = None if cache is None else jax.tree.map(lambda *a: jnp.stack(a), *cache)
      x_btd, stacked = jax.lax.scan(body, x_btd, (params, idx, stacked))
      return x_btd, None if cache is None else tuple(
          jax.tree.map(lambda a, i=i: a[i], stacked) for i in range(self.num_layers))
    caches = []
    for i in range(self.num_layers):
      layer_cache = None if cache is None else cache[i]
      x_btd, layer_cache = body(x_btd, (jax.tree.map(lambda a, i=i: a[i], params), idx[i],
                                        layer_cache))
      caches.append(layer_cache)
    return x_btd, None if cache is None else tuple(caches)

  def unstacked(self) -> "UnstackedLayers":
    """The same layers, each a module on its own copy of its slice of the parameters."""
    return UnstackedLayers(self)


class UnstackedLayers(nnx.Module):
  """A ``LayerStack``'s layers as separate modules, run as a Python loop (same ``__call__``)."""

  def __init__(self, stack: LayerStack):
    graphdef, params = nnx.split(stack.layers)
    self.num_layers = stack.num_layers
    self.layers = nnx.List([nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], params))
                            for i in range(stack.num_layers)])

  def __call__(self, x_btd: jax.Array, ctx: SelfContext, *, rng: jax.Array | None = None,
               cross: CrossContext | None = None, cache: tuple[Cache, ...] | None = None
               ) -> tuple[jax.Array, tuple[Cache, ...] | None]:
    caches = []
    for i, layer in enumerate(self.layers):
      x_btd, layer_cache = layer(x_btd, ctx, jnp.int32(i), fold(rng, i), cross,
                                 None if cache is None else cache[i])
      caches.append(layer_cache)
    return x_btd, None if cache is None else tuple(caches)
