"""The train state and how it is built directly sharded over the mesh.

``build_setup`` traces the model and optimizer abstractly (``nnx.eval_shape`` / ``jax.eval_shape``:
shapes and logical axes, no memory), maps the logical axes to shardings with the one rule table
(``t5like.partitioning``), and ``init_state`` runs the initialiser under ``jax.jit`` with those
``out_shardings``: every device materialises only its own shards, no host ever holds the model.

Parameters live in the state as a plain nested dict of arrays (``nnx.to_pure_dict``), so the
optimizer, the checkpoint and the restore target all see ordinary pytrees; the model is
re-assembled inside the step with ``nnx.merge(graphdef, params, model_state)``. ``model_state``
holds the model's non-parameter state: the MoE layers' selection biases (``RouterBias``; no
gradient, no optimizer slots, moved by the step itself), ``{}`` for a dense model.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from t5like import partitioning
from t5like.config import Config, ConfigError
from t5like.models import build_model
from t5like.models.moe import RouterBias
from t5like.training import optimizer as opt_lib

log = logging.getLogger(__name__)


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 []: batches consumed (= optimizer steps taken or skipped).
  params: Any  # Nested dict of parameter arrays (float32 by default).
  opt_state: Any  # optax state (Adafactor statistics), sharded like the parameters.
  skipped_steps: jax.Array  # int32 []: total steps skipped because of a non-finite loss/gradient.
  consecutive_skipped: jax.Array  # int32 []: current run of consecutive skipped steps.
  model_state: Any = flax.struct.field(default_factory=dict)  # Non-parameter model state: MoE
  #   selection biases as a nested dict; {} for dense models (and then not written to checkpoints).


@dataclasses.dataclass
class TrainSetup:
  """Everything static about a run: graph, optimizer, mesh and the sharded state layout."""

  cfg: Config
  mesh: Mesh
  graphdef: Any  # nnx GraphDef of the model (structure, no arrays).
  tx: optax.GradientTransformation  # Clipping + Adafactor (no learning rate: see optimizer.py).
  schedule: optax.Schedule  # Learning rate as a function of TrainState.step.
  param_axes: Any  # Nested dict of logical-axes tuples, parallel to params.
  abstract_state: TrainState  # ShapeDtypeStructs carrying their NamedShardings.
  state_shardings: TrainState  # NamedShardings (out_shardings of init, in/out of the step).
  batch_sharding: NamedSharding  # [batch, length] arrays: rows over the data shards.
  replicated: NamedSharding

  @property
  def num_params(self) -> int:
    return sum(x.size for x in jax.tree.leaves(self.abstract_state.params))


def _axes(variables):
  return nnx.to_pure_dict(jax.tree.map(
      lambda v: tuple(v.get_metadata().get("out_sharding") or (None,) * len(v.value.shape)),
      variables, is_leaf=lambda x: isinstance(x, nnx.Variable)))


def _model_parts(cfg: Config, mesh: Mesh):
  """(graphdef, abstract params as pure dict, logical axes as pure dict, logical axes of the
  model state) of ``cfg.model``, its operations' backend chosen for ``mesh``'s devices (logged)."""
  abs_model = nnx.eval_shape(lambda: build_model(cfg.model, nnx.Rngs(cfg.train.seed), mesh))
  graphdef, abs_params, abs_model_state, rest = nnx.split(abs_model, nnx.Param, RouterBias, ...)
  if jax.tree.leaves(rest):
    raise ValueError(f"the model holds non-parameter state, which the trainer does not carry: "
                     f"{jax.tree.map(lambda x: x.shape, rest)}")
  return (graphdef, nnx.to_pure_dict(abs_params), _axes(abs_params), _axes(abs_model_state))


def _init_fn(cfg: Config, tx: optax.GradientTransformation, mesh: Mesh):
  def init() -> TrainState:
    model = build_model(cfg.model, nnx.Rngs(cfg.train.seed), mesh)
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    zero = jnp.zeros((), jnp.int32)
    return TrainState(step=zero, params=params, opt_state=tx.init(params), skipped_steps=zero,
                      consecutive_skipped=zero,
                      model_state=nnx.to_pure_dict(nnx.state(model, RouterBias)))
  return init


def check_batch_layout(cfg: Config, mesh) -> None:
  """Batch sizes must split evenly over processes, data shards and microbatches."""
  shards = partitioning.data_shards(mesh)
  procs = jax.process_count()
  b, m = cfg.train.batch_size, cfg.train.microbatches
  where = f"mesh dcn*data*expert*fsdp = {shards} ({dict(mesh.shape)})"
  dcn = mesh.shape.get("dcn", 1)
  if dcn > 1 and (b // m) % dcn:
    raise ConfigError(
        f"train.batch_size={b} / train.microbatches={m} = {b // m} rows per microbatch cannot be "
        f"split over the {dcn} slices (mesh dcn={dcn}): make it a multiple of {dcn} (of "
        f"{shards} for every data shard), or change mesh.slices")
  if (b // m) % shards:
    raise ConfigError(
        f"train.batch_size={b} / train.microbatches={m} = {b // m} rows per microbatch is not "
        f"divisible by the data shards: {where}. Make the (micro)batch a multiple of {shards}, "
        "or move devices to mesh.tensor")
  if b % procs:
    raise ConfigError(f"train.batch_size={b} is not divisible by the {procs} processes")
  eb = cfg.train.eval_batch_size or b
  if eb % shards or eb % procs:
    raise ConfigError(
        f"train.eval_batch_size={eb} must be divisible by the data shards ({where}) and by the "
        f"{procs} processes")


def build_setup(cfg: Config, mesh: Mesh) -> TrainSetup:
  """Abstract, sharded layout of the train state for ``cfg`` on ``mesh`` (allocates nothing)."""
  with partitioning.axis_rules():
    graphdef, abs_params, param_axes, model_state_axes = _model_parts(cfg, mesh)
    tx = opt_lib.make_optimizer(cfg.train, param_axes)
    abs_state = jax.eval_shape(_init_fn(cfg, tx, mesh))
  opt_axes = opt_lib.optimizer_state_axes(abs_state.opt_state, abs_params, param_axes,
                                          cfg.train.adafactor_min_dim_to_factor)
  partitioning.check_divisible(param_axes, abs_state.params, mesh,
                               allow_replication=cfg.mesh.allow_replication)
  replicated = NamedSharding(mesh, PartitionSpec())
  shardings = TrainState(
      step=replicated,
      params=partitioning.tree_shardings(param_axes, abs_state.params, mesh),
      opt_state=partitioning.tree_shardings(opt_axes, abs_state.opt_state, mesh),
      skipped_steps=replicated,
      consecutive_skipped=replicated,
      model_state=partitioning.tree_shardings(model_state_axes, abs_state.model_state, mesh))
  abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          abs_state, shardings)
  return TrainSetup(cfg=cfg, mesh=mesh, graphdef=graphdef, tx=tx,
                    schedule=opt_lib.learning_rate_schedule(cfg.train), param_axes=param_axes,
                    abstract_state=abstract, state_shardings=shardings,
                    batch_sharding=partitioning.batch_sharding(mesh), replicated=replicated)


def log_memory_layout(setup: TrainSetup) -> dict[str, int]:
  """Logs (and returns) the bytes each device holds of parameters and optimizer state, and the
  arrays the rule table replicates on every device (e.g. norm scales), largest first."""
  state, shardings = setup.abstract_state, setup.state_shardings
  out = {"params": partitioning.bytes_per_device(state.params, shardings.params),
         "opt_state": partitioning.bytes_per_device(state.opt_state, shardings.opt_state)}
  log.info("per device: parameters %.1f MiB + optimizer state %.1f MiB", out["params"] / 2**20,
           out["opt_state"] / 2**20)
  rows = partitioning.replicated_arrays(state.params, shardings.params, setup.mesh)
  if rows:
    log.info("%d parameter arrays replicated on every device (%.2f MiB per device), largest:\n"
             "  %s", len(rows), sum(r[2] for r in rows) / 2**20,
             "\n  ".join(f"{p} {shape}: {n:,} B" for p, shape, n in rows[:8]))
  out["replicated_params"] = sum(r[2] for r in rows)
  return out


def init_state(setup: TrainSetup) -> TrainState:
  """Random initial state, created shard by shard on the devices (jit with out_shardings)."""
  init = jax.jit(_init_fn(setup.cfg, setup.tx, setup.mesh), out_shardings=setup.state_shardings)
  with jax.set_mesh(setup.mesh), partitioning.axis_rules(setup.mesh):
    return init()


def fresh_state_from_params(setup: TrainSetup, params: Any, model_state: Any = None) -> TrainState:
  """A step-0 state around given (sharded) parameters and model state (MoE biases; default:
  zero): fresh optimizer, no skipped steps."""
  if model_state is None:
    model_state = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype),
                               setup.abstract_state.model_state)

  def make(p, s):
    zero = jnp.zeros((), jnp.int32)
    return TrainState(step=zero, params=p, opt_state=setup.tx.init(p), skipped_steps=zero,
                      consecutive_skipped=zero, model_state=s)
  fn = jax.jit(make, in_shardings=(setup.state_shardings.params,
                                   setup.state_shardings.model_state),
               out_shardings=setup.state_shardings)
  with jax.set_mesh(setup.mesh):
    return fn(params, model_state)


def all_finite(tree: Any) -> jax.Array:
  """Scalar bool: every element of every floating array in ``tree`` is finite."""
  leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
  if not leaves:
    return jnp.array(True)
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def describe_shardings(setup: TrainSetup) -> dict[str, str]:
  """'path': 'PartitionSpec' for every parameter (for logs and tests)."""
  out = {}
  for path, s in jax.tree_util.tree_flatten_with_path(setup.state_shardings.params)[0]:
    out["/".join(str(getattr(k, "key", k)) for k in path)] = str(s.spec)
  return out
