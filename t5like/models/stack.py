"""A stack of identical layers whose parameters are stacked on a leading ``layers`` axis.

The stack runs either under ``lax.scan`` (one compiled layer, the default for real sizes) or as a
Python loop over the same stacked parameters: both read one checkpoint format, so a model saved
scanned restores unrolled and vice versa. Each layer may be rematerialised by a named policy.
``unstacked`` gives the same layers as separate modules (generation's decode step: slicing the
stacked weights inside every step would copy them once per token).

A stack whose layers differ (dense and mixture-of-experts feed-forwards, ``model.moe``) is a
``MixedStack``: one ``LayerStack`` per run of consecutive alike layers, run in order. Under
``moe.collect_stats()`` a stack keeps its MoE layers' ``MoEStats`` as ``self.stats``.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from t5like.config.model import ModelConfig
from t5like.models.blocks import CrossContext, SelfContext
from t5like.models import moe
from t5like.models.layers import fold

Cache = Any  # Per layer, what the layer's block takes as ``cache`` (a tuple over layers).


def remat_policy(name: str):
  """Maps ``ModelConfig.remat_policy`` to a ``jax.checkpoint`` policy (None = no remat)."""
  cp = jax.checkpoint_policies
  return {
      "none": None,
      "full": cp.nothing_saveable,
      "dots": cp.checkpoint_dots,
      "dots_no_batch": cp.dots_with_no_batch_dims_saveable,
      "attention_out": cp.save_only_these_names("attention_out"),
  }[name]


def _pop_stats(layer: nnx.Module) -> moe.MoEStats | None:
  """The MoE stats a layer recorded (``moe.collect_stats``), taken off it; None if none."""
  if not moe.collecting():
    return None
  found = jax.tree.leaves(nnx.to_pure_dict(nnx.pop(layer, nnx.Intermediate)),
                          is_leaf=lambda v: isinstance(v, moe.MoEStats))
  return found[0] if found else None


class LayerStack(nnx.Module):

  def __init__(self, make_layer: Callable[[nnx.Rngs], nnx.Module], num_layers: int,
               cfg: ModelConfig, *, rngs: nnx.Rngs, first_index: int = 0):
    self.num_layers = num_layers
    self.first_index = first_index  # Index of the first layer in the whole stack (masks, rngs).
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
      x, layer_cache = layer(x, ctx, i, fold(rng, i), cross, layer_cache)
      return x, (layer_cache, _pop_stats(layer))

    if self.remat != "none":
      body = jax.checkpoint(body, policy=remat_policy(self.remat), prevent_cse=not self.scan)
    idx = self.first_index + jnp.arange(self.num_layers)
    if self.scan:
      stacked = None if cache is None else jax.tree.map(lambda *a: jnp.stack(a), *cache)
      x_btd, (stacked, stats) = jax.lax.scan(body, x_btd, (params, idx, stacked))
      caches = None if cache is None else tuple(
          jax.tree.map(lambda a, i=i: a[i], stacked) for i in range(self.num_layers))
    else:
      caches, per_layer = [], []
      for i in range(self.num_layers):
        layer_cache = None if cache is None else cache[i]
        x_btd, (layer_cache, s) = body(x_btd, (jax.tree.map(lambda a, i=i: a[i], params),
                                               idx[i], layer_cache))
        caches.append(layer_cache)
        per_layer.append(s)
      caches = None if cache is None else tuple(caches)
      stats = jax.tree.map(lambda *a: jnp.stack(a), *per_layer)
    if stats is not None:
      self.stats = nnx.Intermediate(stats)  # MoEStats, [layers] leading (moe.pop_layer_stats).
    return x_btd, caches

  def unstacked(self) -> "UnstackedLayers":
    """The same layers, each a module on its own copy of its slice of the parameters."""
    return UnstackedLayers(self)


class UnstackedLayers(nnx.Module):
  """A ``LayerStack``'s layers as separate modules, run as a Python loop (same ``__call__``)."""

  def __init__(self, stack: LayerStack):
    graphdef, params = nnx.split(stack.layers)
    self.num_layers = stack.num_layers
    self.first_index = stack.first_index
    self.layers = nnx.List([nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], params))
                            for i in range(stack.num_layers)])

  def __call__(self, x_btd: jax.Array, ctx: SelfContext, *, rng: jax.Array | None = None,
               cross: CrossContext | None = None, cache: tuple[Cache, ...] | None = None
               ) -> tuple[jax.Array, tuple[Cache, ...] | None]:
    caches = []
    for i, layer in enumerate(self.layers):
      j = self.first_index + i
      x_btd, layer_cache = layer(x_btd, ctx, jnp.int32(j), fold(rng, j), cross,
                                 None if cache is None else cache[i])
      _pop_stats(layer)
      caches.append(layer_cache)
    return x_btd, None if cache is None else tuple(caches)


class _Runs(nnx.Module):
  """Stacks run one after the other, a model's ``cache`` tuple split between them."""

  def __init__(self, runs: list[nnx.Module]):
    self.runs = nnx.List(runs)
    self.num_layers = sum(r.num_layers for r in runs)

  def __call__(self, x_btd: jax.Array, ctx: SelfContext, *, rng: jax.Array | None = None,
               cross: CrossContext | None = None, cache: tuple[Cache, ...] | None = None
               ) -> tuple[jax.Array, tuple[Cache, ...] | None]:
    caches, start = [], 0
    for run in self.runs:
      part = None if cache is None else cache[start:start + run.num_layers]
      x_btd, part = run(x_btd, ctx, rng=rng, cross=cross, cache=part)
      caches.extend(part or ())
      start += run.num_layers
    return x_btd, None if cache is None else tuple(caches)

  def unstacked(self) -> "_Runs":
    return _Runs([run.unstacked() for run in self.runs])


class MixedStack(_Runs):
  """Layers of two kinds in a given order: a ``LayerStack`` per run of alike layers."""

  def __init__(self, make_layer: Callable[[nnx.Rngs, bool], nnx.Module], moe_flags: Sequence[bool],
               cfg: ModelConfig, *, rngs: nnx.Rngs):
    runs, start = [], 0
    for is_moe, group in itertools.groupby(moe_flags):
      n = len(list(group))
      runs.append(LayerStack(lambda r, m=is_moe: make_layer(r, m), n, cfg, rngs=rngs,
                             first_index=start))
      start += n
    super().__init__(runs)


def build_stack(make_layer: Callable[[nnx.Rngs, bool], nnx.Module], moe_flags: Sequence[bool],
                cfg: ModelConfig, *, rngs: nnx.Rngs) -> LayerStack | MixedStack:
  """One scanned ``LayerStack`` when all layers are alike (a dense model's layout), else a
  ``MixedStack`` (``make_layer(rngs, moe)`` builds one layer)."""
  if len(set(moe_flags)) == 1:
    return LayerStack(lambda r: make_layer(r, moe_flags[0]), len(moe_flags), cfg, rngs=rngs)
  return MixedStack(make_layer, moe_flags, cfg, rngs=rngs)
