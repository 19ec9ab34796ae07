"""Device mesh and the one rule table that maps logical axis names to mesh axes.

Model code names only logical axes (``batch, length, embed, heads, kv, mlp, vocab, layers,
expert``); this module decides where they live on the ``(dcn, data, expert, fsdp, tensor)`` mesh
(``dcn``: data parallelism across the slices of a multi-slice run, size 1 on one slice; see
``make_mesh``):

=========  ===================  ==============================================================
logical    mesh axes            why
=========  ===================  ==============================================================
batch      (dcn, data, expert,  every slice, data-parallel replica, expert and FSDP shard reads
           fsdp)                its rows
expert     expert               MoE experts (routed-expert weights, router columns, the bias);
                                the capacity path exchanges tokens over it (models/moe_dispatch)
embed      (expert, fsdp)       parameters (and their optimizer state) sharded over FSDP and, on
                                an expert-parallel mesh, over ``expert`` too; an expert's own
           fsdp                 weights, whose ``expert`` axis already took that mesh axis, fall
                                back to the next row
heads      tensor               attention heads split for tensor parallelism
mlp        tensor               SwiGLU hidden units split for tensor parallelism
vocab      tensor               embedding rows / logits split for tensor parallelism
kv, length, layers  replicated  head_dim, sequence and the scanned layer axis stay whole
lookup     replicated           the embedding table's ``embed`` axis where tokens are looked up,
                                gathered: a rule on TPU chips without SparseCores only (below)
=========  ===================  ==============================================================

A mesh axis is used at most once per array, and the rows are tried in order (flax's
logical-to-mesh resolution skips a row whose mesh axes are taken): on activations ``batch`` takes
``expert`` and ``fsdp`` first, so ``embed`` is then left unsharded. Dense weights on an
expert-parallel mesh are FSDP-sharded over all of ``(expert, fsdp)`` (as MaxText's ``embed``
rule), not replicated across ``expert``: less memory a chip and a shorter compile
(docs/compile.md).

On TPU chips with SparseCores, ``compiler_options`` has the steps' collectives and large sorts
run on them (``mesh.sparsecore_collectives``, on by default): the TensorCores only compute, and
an all-gather stays an all-gather. Without it, libtpu rewrites each all-gather and
reduce-scatter over a whole v5p slice (one 64-chip ``fsdp`` axis of a v5p-128) into an
all-reduce of a zero-padded full-size buffer on the TensorCore, a kernel whose code grows with
the weight and is compiled once per weight shape: on v5p-128 those kernels were 36-45 % of the
8B configs' compile (docs/compile.md).

Looking tokens up in a table sharded over ``embed``, XLA moves the looked-up rows to their batch
shards with an all-to-all. libtpu computes each all-to-all's ICI routing at compile time, alone
on one thread: on a v5e-256 (no SparseCores) 6-12 s per lookup and its gradient, a quarter to a
third of the paper configs' compile. There the table is gathered at the lookup instead
(``lookup`` replicated: FSDP's gather-at-use, as for every other weight), and each device looks
up its own rows, for a little more memory. On v5p the all-to-all goes to the SparseCores, and the
gathered table cost more memory for no shorter compile (docs/compile.md has the numbers).
"""
from __future__ import annotations

import logging
import math
from typing import Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from t5like.config.schema import ConfigError
from t5like.config.train import MeshConfig

log = logging.getLogger(__name__)

MESH_AXES = ("dcn", "data", "expert", "fsdp", "tensor")
ICI_AXES = MESH_AXES[1:]  # The axes inside one slice (``mesh.data`` ... ``mesh.tensor``).

LOGICAL_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("dcn", "data", "expert", "fsdp")),
    ("expert", "expert"),
    ("embed", ("expert", "fsdp")),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
    ("kv", None),
    ("length", None),
    ("layers", None),
)


def mesh_shape(cfg: MeshConfig, num_devices: int) -> tuple[int, int, int, int]:
  """Resolves -1 and checks that the (data, expert, fsdp, tensor) sizes use exactly
  ``num_devices`` devices (one slice's)."""
  cfg.validate()
  sizes = [cfg.data, cfg.expert, cfg.fsdp, cfg.tensor]
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise ConfigError(
          f"mesh data/expert/fsdp/tensor={tuple(sizes)}: the fixed axes ({known} devices) do not divide "
          f"the {num_devices} available devices; change mesh.data/mesh.tensor")
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise ConfigError(
        f"mesh data/expert/fsdp/tensor={tuple(sizes)} uses {math.prod(sizes)} devices but "
        f"{num_devices} are available; set one axis to -1 or make the product {num_devices}")
  return tuple(sizes)  # type: ignore[return-value]


# libtpu's options for collectives on the SparseCores (those MaxText's tuned v5p configs set and
# TPU7x's libtpu defaults to); per compile, so each program gets its own chip's choice.
SPARSECORE_COLLECTIVES: dict[str, bool] = {
    "xla_tpu_enable_sparse_core_collective_offload_all_gather": True,
    "xla_tpu_enable_sparse_core_collective_offload_reduce_scatter": True,
    "xla_tpu_enable_sparse_core_collective_offload_all_reduce": True,
    "xla_tpu_use_tc_device_shape_on_sc": True,
    "xla_sc_enable_instruction_fusion": False,
    "xla_sc_disable_megacore_partitioning": True,
    # The TensorCore's own overlap of collectives (continuation fusion) gives way to the offload.
    "xla_tpu_enable_async_collective_fusion_fuse_all_gather": False,
    "xla_tpu_enable_async_collective_fusion_fuse_reduce_scatter": False,
    "xla_tpu_enable_async_collective_fusion_fuse_all_reduce": False,
    "xla_enable_async_all_gather": True,
    "xla_tpu_prefer_async_allgather_to_allreduce": True,  # Keeps whole-slice all-gathers native.
    # Large sorts too (RedLLM's embedding gradients sort the whole batch's token ids).
    "xla_tpu_enable_offloading_sort_to_sparsecore": True,
}
# ``device_kind`` of the chips with SparseCores ("TPU v5" is v5p; v5e, "TPU v5 lite", has none).
SPARSECORE_CHIPS = ("TPU v4", "TPU v5", "TPU v6 lite", "TPU7x")


def _sparsecores(mesh: Mesh) -> bool | None:
  """Whether ``mesh``'s TPU chips have SparseCores; None for other platforms."""
  device = mesh.devices.flat[0]
  return device.device_kind in SPARSECORE_CHIPS if device.platform == "tpu" else None


def compiler_options(cfg: MeshConfig, mesh: Mesh) -> dict[str, bool]:
  """XLA options for the steps compiled on ``mesh`` (``jax.jit(compiler_options=)``)."""
  if cfg.sparsecore_collectives and _sparsecores(mesh):
    return dict(SPARSECORE_COLLECTIVES)
  return {}


def device_slices(devices: Sequence[jax.Device]) -> int:
  """How many slices ``devices`` span: distinct ``slice_index`` values (multi-slice TPU, or an
  AOT topology with ``num_slices``), 1 for devices without one (CPU, GPU, one slice)."""
  return len({getattr(d, "slice_index", 0) for d in devices})


def num_slices(cfg: MeshConfig, devices: Sequence[jax.Device]) -> int:
  """``mesh.slices`` resolved (0 = the devices' own slices), checked against the devices."""
  cfg.validate()
  have = device_slices(devices)
  slices = cfg.slices or have
  if have > 1 and slices != have:
    raise ConfigError(f"mesh.slices={cfg.slices} but the {len(devices)} devices span {have} "
                      f"slices (slice_index); set mesh.slices={have} or 0 (auto)")
  if len(devices) % slices:
    raise ConfigError(f"mesh.slices={slices} does not divide the {len(devices)} devices; every "
                      "slice must have the same number of devices")
  return slices


def _slice_grid(ici: tuple[int, ...], devices: Sequence[jax.Device]) -> np.ndarray:
  """One slice's devices laid out as ``ici``: ICI-aware on TPUs, row-major elsewhere."""
  from jax.experimental import mesh_utils
  try:
    return _ici_aware(mesh_utils.create_device_mesh, ici, devices=list(devices))
  except Exception:  # Non-TPU topologies: plain row-major order.
    return np.asarray(devices).reshape(ici)


def _ici_aware(build, *args, **kwargs) -> np.ndarray:
  """``build`` (a ``mesh_utils`` builder) over the slice's torus; where a logical axis is no
  product of physical axes (an 8-way expert axis on a 4x4x4 v5p-128 or a 16x16 v5e-256) with the
  physical axes split between logical ones, still neighbours on ICI rather than row-major order."""
  try:
    return build(*args, **kwargs)
  except NotImplementedError:
    return build(*args, allow_split_physical_axes=True, **kwargs)


def _hybrid_grid(ici: tuple[int, ...], dcn: tuple[int, ...], devices: list, slices: int):
  """The multi-slice device grid: ``jax``'s hybrid builder where the devices say which slice
  (``slice_index``) or process (``process_is_granule``: GPUs, CPU processes) they belong to;
  fake CPU devices of one process are split into ``slices`` consecutive groups (tests)."""
  from jax.experimental import mesh_utils
  if device_slices(devices) == slices:
    return _ici_aware(mesh_utils.create_hybrid_device_mesh, ici, dcn, devices)
  if len({d.process_index for d in devices}) == slices:
    return _ici_aware(mesh_utils.create_hybrid_device_mesh, ici, dcn, devices,
                      process_is_granule=True)
  if len({d.process_index for d in devices}) > 1:
    raise ConfigError(f"mesh.slices={slices}: the devices come from "
                      f"{len({d.process_index for d in devices})} processes and carry no "
                      "slice_index; on GPUs/CPUs each process is one slice, so set mesh.slices "
                      "to the number of processes")
  per = len(devices) // slices
  blocks = [_slice_grid(ici, devices[i * per:(i + 1) * per]) for i in range(slices)]
  return np.block(np.asarray(blocks + [None], dtype=object)[:-1].reshape(dcn).tolist())


def make_mesh(cfg: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A (dcn, data, expert, fsdp, tensor) mesh with Auto axis types (what logical-rule sharding
  needs). ``mesh.data`` ... ``mesh.tensor`` are the sizes inside one slice; on several slices
  (``mesh.slices``) the slices multiply ``dcn`` (data parallelism over DCN, the default:
  ``mesh.dcn_axis="data"``) or ``fsdp`` (``mesh.dcn_axis="fsdp"``: parameters sharded across
  slices, every layer's all-gather crossing DCN), as MaxText's ``dcn_*_parallelism``."""
  devices = list(jax.devices() if devices is None else devices)
  slices = num_slices(cfg, devices)
  ici = (1,) + mesh_shape(cfg, len(devices) // slices)
  if slices == 1:
    return Mesh(_slice_grid(ici, devices), MESH_AXES)
  dcn = [1] * len(MESH_AXES)
  dcn[MESH_AXES.index("dcn" if cfg.dcn_axis == "data" else "fsdp")] = slices
  return Mesh(_hybrid_grid(ici, tuple(dcn), devices, slices), MESH_AXES)


def rules(mesh: Mesh | None = None) -> tuple:
  """The rule table for ``mesh``'s chips: with ``lookup`` (replicated) on TPUs without
  SparseCores; elsewhere the lookup's table is left unconstrained (XLA's layout)."""
  gather = mesh is not None and _sparsecores(mesh) is False
  return LOGICAL_RULES + ((("lookup", None),) if gather else ())


def axis_rules(mesh: Mesh | None = None):
  """Context manager activating the rule table (``rules(mesh)``) for params and activation
  constraints; every step on a mesh is traced under it."""
  return nnx.logical_axis_rules(rules(mesh))


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
  """[batch, length] arrays: rows over the data shards (dcn, data, expert, fsdp), length whole."""
  return NamedSharding(mesh, logical_to_spec(("batch", "length")))


def _mesh_names(entry) -> tuple[str, ...]:
  return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def fitted_spec(axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh) -> PartitionSpec:
  """The rule table's spec for ``axes``, leaving replicated any dimension the mesh does not divide.

  Callers that place parameters use ``plan_shardings``, which reports those dimensions first.
  """
  spec = logical_to_spec(axes)
  out = []
  for dim, entry in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    size = math.prod(mesh.shape[n] for n in _mesh_names(entry))
    out.append(entry if size == 1 or dim % size == 0 else None)
  return PartitionSpec(*out)


def tree_shardings(axes_tree, abstract_tree, mesh: Mesh):
  """NamedShardings for a tree of arrays given a parallel tree of logical-axes tuples."""
  leaves, treedef = jax.tree.flatten(abstract_tree)
  flat_axes = treedef.flatten_up_to(axes_tree)
  return jax.tree.unflatten(treedef, [
      NamedSharding(mesh, fitted_spec(a, x.shape, mesh)) for a, x in zip(flat_axes, leaves)])


def _divisors(n: int) -> list[int]:
  return [d for d in range(1, n + 1) if n % d == 0]


def undivided_dims(axes_tree, abstract_tree, mesh: Mesh) -> list[str]:
  """One line per array dimension the rule table shards but the mesh does not divide."""
  with_path, treedef = jax.tree_util.tree_flatten_with_path(abstract_tree)
  problems = []
  for (path, x), axes in zip(with_path, treedef.flatten_up_to(axes_tree)):
    spec = tuple(logical_to_spec(axes))
    for dim, axis, entry in zip(x.shape, axes, spec + (None,) * len(x.shape)):
      names = _mesh_names(entry)
      size = math.prod(mesh.shape[n] for n in names)
      if size > 1 and dim % size:
        fits = ", ".join(str(d) for d in _divisors(dim) if 1 < d <= 4 * size) or "none"
        problems.append(
            f"{jax.tree_util.keystr(path)} {tuple(x.shape)} axes {tuple(axes)}: {axis}={dim} is "
            f"not divisible by mesh {'x'.join(names)}={size} (sizes dividing {dim}: {fits})")
  return problems


def check_divisible(axes_tree, abstract_tree, mesh: Mesh, *, allow_replication: bool,
                    what: str = "parameters") -> None:
  """Raises ``ConfigError`` (before anything compiles) naming every dimension the mesh does not
  divide, unless ``allow_replication`` (then each is logged: it will be replicated)."""
  problems = undivided_dims(axes_tree, abstract_tree, mesh)
  if not problems:
    return
  mesh_desc = ", ".join(f"{k}={v}" for k, v in mesh.shape.items())
  head = (f"{len(problems)} {what} dimension(s) cannot be sharded on mesh {mesh_desc} as the rule "
          "table says")
  if allow_replication:
    log.warning("%s; they are replicated instead (mesh.allow_replication=true):\n  %s", head,
                "\n  ".join(problems))
    return
  raise ConfigError(
      f"{head} (they would be silently replicated on every device):\n  "
      + "\n  ".join(problems[:12]) + ("\n  ..." if len(problems) > 12 else "")
      + "\nChange mesh.fsdp / mesh.tensor (or the model size) so that they divide these "
      "dimensions, or set mesh.allow_replication=true to replicate them deliberately.")


def bytes_per_device(abstract_tree, shardings) -> int:
  """Bytes one device holds of ``abstract_tree`` laid out by ``shardings``."""
  total = 0
  for x, s in zip(jax.tree.leaves(abstract_tree), jax.tree.leaves(shardings)):
    shard = s.shard_shape(x.shape)
    total += math.prod(shard) * np.dtype(x.dtype).itemsize
  return total


def replicated_arrays(abstract_tree, shardings, mesh: Mesh) -> list[tuple[str, tuple, int]]:
  """(path, shape, bytes) of the arrays every device holds whole (rule-table replication, e.g.
  norm scales), largest first; empty on one device."""
  if mesh.size == 1:
    return []
  rows = []
  for (path, x), s in zip(jax.tree_util.tree_flatten_with_path(abstract_tree)[0],
                          jax.tree.leaves(shardings)):
    if x.ndim and tuple(s.shard_shape(x.shape)) == tuple(x.shape):
      rows.append((jax.tree_util.keystr(path), tuple(x.shape),
                   math.prod(x.shape) * np.dtype(x.dtype).itemsize))
  return sorted(rows, key=lambda r: -r[2])


def data_shards(mesh: Mesh) -> int:
  """How many ways a batch is split (the mesh axes that ``batch`` maps to)."""
  spec = logical_to_spec(("batch",))[0]
  names = () if spec is None else (spec,) if isinstance(spec, str) else tuple(spec)
  return math.prod(mesh.shape[n] for n in names)


def shard_map_logical(fn, in_axes: Sequence[Sequence[str | None]],
                      out_axes: Sequence[str | None]):
  """``fn`` run once per shard of the current mesh (``jax.set_mesh``), its arguments split by
  the rule table: for custom kernels (Pallas) that XLA cannot partition itself. A dimension the
  mesh does not divide stays whole on every device. Outside a mesh, ``fn`` itself."""
  def wrapped(*args):
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
      return fn(*args)
    in_specs = tuple(fitted_spec(a, x.shape, mesh) for a, x in zip(in_axes, args))
    out_spec = fitted_spec(out_axes, args[0].shape, mesh)  # Output shaped like the first arg.
    return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_spec,
                         check_vma=False)(*args)
  return wrapped
