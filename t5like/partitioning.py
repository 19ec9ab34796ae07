"""Device mesh and the one rule table that maps logical axis names to mesh axes.

Model code names only logical axes (``batch, length, embed, heads, kv, mlp, vocab, layers``);
this module decides where they live on the ``(data, fsdp, tensor)`` mesh:

=========  ===================  ==============================================================
logical    mesh axes            why
=========  ===================  ==============================================================
batch      (data, fsdp)         every data-parallel replica and FSDP shard reads its own rows
embed      fsdp                 parameters (and their optimizer state) sharded over FSDP
heads      tensor               attention heads split for tensor parallelism
mlp        tensor               SwiGLU hidden units split for tensor parallelism
vocab      tensor               embedding rows / logits split for tensor parallelism
kv, length, layers  replicated  head_dim, sequence and the scanned layer axis stay whole
=========  ===================  ==============================================================

A mesh axis is used at most once per array: on activations ``batch`` takes ``fsdp`` first, so
``embed`` is then left unsharded (flax's logical-to-mesh resolution skips taken axes).
"""
from __future__ import annotations

import math
from typing import Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from t5like.config.schema import ConfigError
from t5like.config.train import MeshConfig

MESH_AXES = ("data", "fsdp", "tensor")

LOGICAL_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
    ("kv", None),
    ("length", None),
    ("layers", None),
)


def mesh_shape(cfg: MeshConfig, num_devices: int) -> tuple[int, int, int]:
  """Resolves -1 and checks that the mesh uses exactly ``num_devices`` devices."""
  cfg.validate()
  sizes = [cfg.data, cfg.fsdp, cfg.tensor]
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise ConfigError(
          f"mesh data/fsdp/tensor={tuple(sizes)}: the fixed axes ({known} devices) do not divide "
          f"the {num_devices} available devices; change mesh.data/mesh.tensor")
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise ConfigError(
        f"mesh data/fsdp/tensor={tuple(sizes)} uses {math.prod(sizes)} devices but "
        f"{num_devices} are available; set one axis to -1 or make the product {num_devices}")
  return tuple(sizes)  # type: ignore[return-value]


def make_mesh(cfg: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A (data, fsdp, tensor) mesh with Auto axis types (what logical-rule sharding needs)."""
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(cfg, len(devices))
  try:
    from jax.experimental import mesh_utils
    grid = mesh_utils.create_device_mesh(shape, devices=devices)
  except Exception:  # Non-TPU topologies or unusual shapes: plain row-major order.
    grid = np.asarray(devices).reshape(shape)
  return Mesh(grid, MESH_AXES)


def axis_rules():
  """Context manager activating the rule table for params and activation constraints."""
  return nnx.logical_axis_rules(LOGICAL_RULES)


def logical_to_spec(axes: Sequence[str | None]) -> PartitionSpec:
  from flax import linen as nn
  return nn.logical_to_mesh_axes(tuple(axes), LOGICAL_RULES)


def state_shardings(abstract_state, mesh: Mesh):
  """NamedShardings for an (abstract) nnx State whose Variables carry logical axis names."""
  with axis_rules():
    specs = nnx.get_partition_spec(abstract_state)
  return jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                      is_leaf=lambda x: isinstance(x, PartitionSpec))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """[batch, length] arrays: rows over (data, fsdp), length replicated."""
  return NamedSharding(mesh, logical_to_spec(("batch", "length")))


def fitted_spec(axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh) -> PartitionSpec:
  """The rule table's spec for ``axes``, leaving replicated any dimension the mesh does not divide.

  (E.g. a 1-layer stack, or 3 heads on tensor=2: that dimension stays whole instead of failing.)
  """
  spec = logical_to_spec(axes)
  out = []
  for dim, entry in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
    size = math.prod(mesh.shape[n] for n in names)
    out.append(entry if size == 1 or dim % size == 0 else None)
  return PartitionSpec(*out)


def tree_shardings(axes_tree, abstract_tree, mesh: Mesh):
  """NamedShardings for a tree of arrays given a parallel tree of logical-axes tuples."""
  leaves, treedef = jax.tree.flatten(abstract_tree)
  flat_axes = treedef.flatten_up_to(axes_tree)
  return jax.tree.unflatten(treedef, [
      NamedSharding(mesh, fitted_spec(a, x.shape, mesh)) for a, x in zip(flat_axes, leaves)])


def data_shards(mesh: Mesh) -> int:
  """How many ways a batch is split (the mesh axes that ``batch`` maps to)."""
  spec = logical_to_spec(("batch",))[0]
  names = () if spec is None else (spec,) if isinstance(spec, str) else tuple(spec)
  return math.prod(mesh.shape[n] for n in names)
