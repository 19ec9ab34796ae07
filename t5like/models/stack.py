"""A stack of identical layers whose parameters are stacked on a leading ``layers`` axis.

The stack runs either under ``lax.scan`` (one compiled layer, the default for real sizes) or as a
Python loop over the same stacked parameters: both read one checkpoint format, so a model saved
scanned restores unrolled and vice versa. Each layer may be rematerialised by a named policy.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from t5like.config.model import ModelConfig
from t5like.kernels.attention_train import RESIDUALS
from t5like.models.blocks import CrossContext, SelfContext
from t5like.models.layers import fold


def remat_policy(name: str):
  """Maps ``ModelConfig.remat_policy`` to a ``jax.checkpoint`` policy (None = no remat)."""
  cp = jax.checkpoint_policies
  return {
      "none": None,
      "full": cp.nothing_saveable,
      "dots": cp.checkpoint_dots,
      "dots_no_batch": cp.save_from_both_policies(
          cp.dots_with_no_batch_dims_saveable, cp.save_only_these_names(RESIDUALS)),
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
               cross: CrossContext | None = None) -> jax.Array:
    graphdef, params = nnx.split(self.layers)

    def body(x, xs):
      layer_params, i = xs
      layer = nnx.merge(graphdef, layer_params)
      return layer(x, ctx, i, fold(rng, i), cross), None

    policy = remat_policy(self.remat)
    if self.remat != "none":
      body = jax.checkpoint(body, policy=policy, prevent_cse=not self.scan)
    idx = jnp.arange(self.num_layers)
    if self.scan:
      x_btd, _ = jax.lax.scan(body, x_btd, (params, idx))
    else:
      for i in range(self.num_layers):
        x_btd, _ = body(x_btd, (jax.tree.map(lambda a, i=i: a[i], params), idx[i]))
    return x_btd
