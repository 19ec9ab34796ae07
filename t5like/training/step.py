"""The jitted train and eval steps.

Train step: gradient accumulation over ``train.microbatches`` (a ``lax.scan``; the summed loss
is normalised by the target tokens of the *whole* batch, so any microbatch count gives the same
update up to float rounding), cross-entropy + z-loss (+ the MoE layers' balance and router
z-losses, ``moe_balance.py``), global-norm clipping and Adafactor
(``optimizer.py``), learning rate from ``TrainState.step``, and a non-finite guard: when the loss
or the gradient norm is NaN/Inf the update is not applied (parameters and optimizer state are
kept), the step is counted as skipped and the consecutive-skip counter grows. After an applied
step the MoE selection biases (``TrainState.model_state``) move by the global batch's loads.

Both steps are ``jax.jit`` with explicit in/out shardings; the train step donates its state.
They are traced under the mesh and the logical-axis rules, so the models' activation
constraints resolve against the rule table.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from t5like import partitioning
from t5like.models import LossTerms, build_model, cross_entropy_with_z_loss
from t5like.models import moe
from t5like.training import moe_balance
from t5like.training.state import TrainSetup, TrainState

Batch = Mapping[str, jax.Array]


class MeshFunction:
  """A jitted function that is always traced and called under the mesh and the rule table."""

  def __init__(self, fn: Callable, mesh):
    self.fn = fn
    self.mesh = mesh

  def __call__(self, *args):
    with jax.set_mesh(self.mesh), partitioning.axis_rules(self.mesh):
      return self.fn(*args)

  def lower(self, *args):
    with jax.set_mesh(self.mesh), partitioning.axis_rules(self.mesh):
      return self.fn.lower(*args)


def loss_weights(batch: Batch) -> jax.Array:
  w = batch.get("decoder_loss_weights")
  if w is None:
    return (batch["decoder_target_tokens"] > 0).astype(jnp.float32)
  return w.astype(jnp.float32)


def _loss_terms(setup: TrainSetup, params: Any, model_state: Any, batch: Batch, dropout_rng,
                z_loss: float) -> tuple[LossTerms, moe_balance.Stats]:
  """Weighted sums of the loss terms; the loss includes the MoE auxiliary losses (their
  per-token values times the target tokens, so they average like the cross-entropy)."""
  model = nnx.merge(setup.graphdef, params, model_state)
  with moe.collect_stats():
    logits = model(batch, dropout_rng=dropout_rng)
  stats = moe.pop_layer_stats(model)
  terms = cross_entropy_with_z_loss(logits, batch["decoder_target_tokens"], loss_weights(batch),
                                    z_loss)
  if stats:
    aux = moe_balance.aux_loss(stats, setup.cfg.model.moe)
    terms = terms._replace(loss=terms.loss + aux * terms.weight)
  return terms, stats


def split_microbatches(batch: Batch, num: int, mesh) -> Batch:
  """[B, ...] -> [num, B/num, ...], microbatch m = rows m, m+num, ... (strided, so each
  microbatch keeps an equal slice of every data shard and needs no communication)."""
  spec = partitioning.logical_to_spec(("batch",))[0]

  def split(x):
    b = x.shape[0]
    x = x.reshape((b // num, num) + x.shape[1:])
    x = jnp.swapaxes(x, 0, 1)
    return jax.lax.with_sharding_constraint(
        x, NamedSharding(mesh, PartitionSpec(None, spec, *([None] * (x.ndim - 2)))))
  return {k: split(v) for k, v in batch.items()}


def make_train_step(setup: TrainSetup) -> MeshFunction:
  """``step(state, batch) -> (state, metrics)``; metrics are replicated float32 scalars."""
  cfg = setup.cfg
  num_micro = cfg.train.microbatches
  z_loss = cfg.train.z_loss
  use_dropout = cfg.model.dropout_rate > 0
  moe_names = moe.moe_layer_names(
      nnx.eval_shape(lambda: build_model(cfg.model, nnx.Rngs(0)))) if cfg.model.moe.enabled else {}

  def grads_and_terms(params, model_state, batch, step):
    total_weight = jnp.maximum(jnp.sum(loss_weights(batch)), 1.0)
    base_rng = jax.random.fold_in(jax.random.key(cfg.train.seed), step) if use_dropout else None

    def micro(params, mb, index):
      rng = None if base_rng is None else jax.random.fold_in(base_rng, index)

      def loss_fn(p):
        terms, stats = _loss_terms(setup, p, model_state, mb, rng, z_loss)
        return terms.loss / total_weight, (terms, stats)
      (_, (terms, stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
      return grads, terms, stats

    if num_micro == 1:
      return micro(params, batch, 0)
    mbs = split_microbatches(batch, num_micro, setup.mesh)
    zeros = jax.tree.map(jnp.zeros_like, params)
    zero_terms = LossTerms(*[jnp.zeros((), jnp.float32)] * len(LossTerms._fields))
    zero_stats = {} if not moe_names else jax.tree.map(jnp.zeros_like, jax.eval_shape(
        lambda: micro(params, jax.tree.map(lambda x: x[0], mbs), 0)[2]))

    def body(carry, xs):
      mb, index = xs
      out = micro(params, mb, index)
      return jax.tree.map(jnp.add, carry, out), None
    # Loads (and the stats' other sums) add up over the microbatches: the global batch's.
    (grads, terms, stats), _ = jax.lax.scan(body, (zeros, zero_terms, zero_stats),
                                            (mbs, jnp.arange(num_micro)))
    return grads, terms, stats

  def step_fn(state: TrainState, batch: Batch):
    grads, terms, stats = grads_and_terms(state.params, state.model_state, batch, state.step)
    grad_norm = optax.tree.norm(grads)
    lr = jnp.asarray(setup.schedule(state.step), jnp.float32)
    # A step applies only with a finite loss and gradient (Adafactor's update of finite gradients
    # is finite). Known before the update, the choice fuses into each parameter's and optimizer
    # statistic's update kernel instead of a check and a select per array after it.
    finite = jnp.isfinite(terms.loss) & jnp.isfinite(grad_norm)
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)  # noqa
    updates, new_opt = setup.tx.update(grads, state.opt_state, state.params)
    new_params = jax.tree.map(lambda p, u: jnp.where(finite, p + (lr * u).astype(p.dtype), p),
                              state.params, updates)
    skipped = jnp.logical_not(finite).astype(jnp.int32)
    new_state = TrainState(
        step=state.step + 1,
        params=new_params,
        opt_state=keep(new_opt, state.opt_state),
        skipped_steps=state.skipped_steps + skipped,
        consecutive_skipped=jnp.where(finite, 0, state.consecutive_skipped + 1),
        model_state=keep(moe_balance.updated_biases(
            state.model_state, stats, cfg.model.moe.bias_update_rate), state.model_state))
    metrics = _step_metrics(terms, grad_norm, lr, finite, new_state, stats, moe_names,
                            num_micro, cfg.model.moe.capacity_factor > 0)
    return new_state, metrics

  fn = jax.jit(step_fn,
               in_shardings=(setup.state_shardings, setup.batch_sharding),
               out_shardings=(setup.state_shardings, setup.replicated),
               donate_argnums=(0,),
               compiler_options=partitioning.compiler_options(setup.cfg.mesh, setup.mesh))
  return MeshFunction(fn, setup.mesh)


def _step_metrics(terms: LossTerms, grad_norm, lr, finite, new_state: TrainState, stats: dict,
                  moe_names: dict, num_micro: int, capacity: bool) -> dict:
  """The train step's logged scalars: per-token loss terms, the update's, the skip counters and
  (MoE) each layer's load statistics."""
  weight = jnp.maximum(terms.weight, 1.0)
  return {
      "loss": terms.loss / weight,
      "cross_entropy": terms.cross_entropy / weight,
      "z_loss": terms.z_loss / weight,
      "accuracy": terms.correct / weight,
      "target_tokens": terms.weight,
      "grad_norm": grad_norm,
      "learning_rate": lr,
      "finite": finite.astype(jnp.float32),
      "skipped_steps": new_state.skipped_steps.astype(jnp.float32),
      "consecutive_skipped": new_state.consecutive_skipped.astype(jnp.float32),
      **moe_balance.layer_metrics(stats, new_state.model_state, moe_names, num_micro, capacity),
  }


class EvalStep(MeshFunction):
  """``eval(params, batch, model_state=None)``: ``model_state`` may be left out for a dense
  model (it has none); an MoE model's routing needs its biases."""

  def __init__(self, fn: Callable, mesh, needs_state: bool):
    super().__init__(fn, mesh)
    self.needs_state = needs_state

  def _args(self, params, batch, model_state):
    if model_state is None:
      if self.needs_state:
        raise ValueError("this MoE model's eval step needs model_state (TrainState.model_state: "
                         "the experts' selection biases)")
      model_state = {}
    return params, batch, model_state

  def __call__(self, params, batch, model_state=None):
    return super().__call__(*self._args(params, batch, model_state))

  def lower(self, params, batch, model_state=None):
    return super().lower(*self._args(params, batch, model_state))


def make_eval_step(setup: TrainSetup) -> EvalStep:
  """``eval(params, batch, model_state=None) -> dict`` of weighted sums (no dropout): loss,
  cross_entropy, z_loss, correct, weight. Sum them over batches and divide by ``weight`` for
  per-token values. ``model_state``: ``TrainState.model_state`` (MoE biases; none if dense)."""
  z_loss = setup.cfg.train.z_loss

  def eval_fn(params, batch, model_state):
    terms, _ = _loss_terms(setup, params, model_state, batch, None, z_loss)
    return terms._asdict()

  fn = jax.jit(eval_fn, in_shardings=(setup.state_shardings.params, setup.batch_sharding,
                                      setup.state_shardings.model_state),
               out_shardings=setup.replicated,
               compiler_options=partitioning.compiler_options(setup.cfg.mesh, setup.mesh))
  return EvalStep(fn, setup.mesh, bool(jax.tree.leaves(setup.abstract_state.model_state)))


def bind_model_state(eval_step: MeshFunction, model_state: Any) -> Callable:
  """``eval(params, batch)`` with the model state fixed (what held-out scoring calls)."""
  return lambda params, batch: eval_step(params, batch, model_state)
