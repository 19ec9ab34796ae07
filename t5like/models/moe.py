"""Mixture-of-experts feed-forward, DeepSeek-V3 form (docs/moe.md).

  FFN(u) = sum_{shared j} E_j(u) + sum_{i in TopK} g_i E_i(u),     every expert a SwiGLU,
  s_i = sigmoid(u . e_i)  (float32),   TopK = the K largest s_i + b_i  (b: selection only),
  g_i = routed_scaling * s_i / sum_{j in TopK} s_j.

Group-limited routing splits the experts into G groups, scores a group by the sum of its two
largest selection scores s + b, and chooses the top K only among the experts of the top M groups.
The bias b is state, not a parameter (``RouterBias``): the trainer moves it after every optimizer
step by gamma * sign(mean load - load_i) (auxiliary-loss-free balancing).

Compute (dropless): the T*K (token, expert) pairs are sorted by expert, the experts' products
run as grouped products (``jax.lax.ragged_dot``) over the contiguous groups, and the outputs are
un-sorted and combined with the gates. Every routed pair is computed: nothing is dropped.
With ``moe.capacity_factor > 0`` the routed experts run on fixed-size buffers instead, over the
``expert`` mesh axis when there is one (``moe_dispatch.py``); pairs over capacity are dropped.

Under ``collect_stats()`` every call records ``MoEStats`` (loads over the real tokens, the
sequence-wise balance loss, the router z-loss) as an ``nnx.Intermediate`` named ``stats``; the
layer stack collects them.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from t5like.config.model import ModelConfig
from t5like.models.layers import constrain, dropout, dtype, fan_in_init, fold, param
from t5like.models.moe_dispatch import capacity_experts
from t5like.models.mlp import SwiGLU


class RouterBias(nnx.Variable):
  """The per-expert selection bias b: model state, not a parameter (no gradient, no optimizer)."""


class MoEStats(NamedTuple):
  """What one MoE layer reports per call (sums/means over the real, non-padding tokens)."""
  load: jax.Array  # [experts] float32: routed (token, expert) pairs per expert.
  balance_loss: jax.Array  # [] sequence-wise balance loss sum_i f_i P_i, mean over rows (no alpha).
  z_loss: jax.Array  # [] mean over tokens of logsumexp(router logits)^2 (no weight).
  tokens: jax.Array  # [] real tokens seen.
  dropped: jax.Array  # [] (token, expert) pairs of real tokens dropped over capacity.
  chosen: jax.Array | None = None  # [batch, length, K] chosen experts (``collect_stats(routes=
  #   True)``: the expert-assignment analysis), else None.


_COLLECT = contextvars.ContextVar("t5like_moe_collect", default=(False, False))


@contextlib.contextmanager
def collect_stats(routes: bool = False):
  """While tracing inside this context, layer stacks keep their MoE layers' ``MoEStats`` on the
  model (``pop_layer_stats`` reads them), with each token's chosen experts if ``routes``;
  outside it they are discarded."""
  token = _COLLECT.set((True, routes))
  try:
    yield
  finally:
    _COLLECT.reset(token)


def collecting() -> bool:
  return _COLLECT.get()[0]


# ---------------------------------------------------------------------------------------------
# The gate: selection (bias, groups, top-K) and the gate values.


def select_experts(scores_te: jax.Array, bias_e: jax.Array, top_k: int, num_groups: int = 1,
                   top_groups: int = 1) -> jax.Array:
  """Indices [tokens, top_k] (int32) of the experts with the largest ``scores + bias`` (ties:
  lower index first), within each token's ``top_groups`` best groups when ``num_groups > 1``."""
  choice_te = scores_te + jax.lax.stop_gradient(bias_e).astype(scores_te.dtype)
  if num_groups > 1:
    t, e = choice_te.shape
    grouped = choice_te.reshape(t, num_groups, e // num_groups)
    group_score_tg = jax.lax.top_k(grouped, 2)[0].sum(-1)
    _, best_tm = jax.lax.top_k(group_score_tg, top_groups)
    keep_tg = jax.nn.one_hot(best_tm, num_groups, dtype=jnp.bool_).any(axis=1)
    keep_te = jnp.repeat(keep_tg, e // num_groups, axis=1)
    choice_te = jnp.where(keep_te, choice_te, -jnp.inf)
  return jax.lax.top_k(choice_te, top_k)[1]


def gate_values(scores_te: jax.Array, idx_tk: jax.Array, scaling: float) -> jax.Array:
  """g [tokens, top_k]: the chosen unbiased scores normalised to sum 1, times ``scaling``."""
  s_tk = chosen_scores(scores_te, idx_tk)
  return scaling * s_tk / jnp.sum(s_tk, axis=-1, keepdims=True)


@jax.custom_vjp
def chosen_scores(scores_te: jax.Array, idx_tk: jax.Array) -> jax.Array:
  """``take_along_axis(scores, idx, -1)``, differentiated as a one-hot sum over the K choices:
  the gradient of a gather is a scatter-add, which XLA:TPU compiles with a sort of its T * K
  indices (a kernel of ~25k bundles in every MoE step). Reverse mode only (no ``jvp``)."""
  return jnp.take_along_axis(scores_te, idx_tk, axis=-1)


def _chosen_fwd(scores_te, idx_tk):
  experts_0e = jnp.zeros((0, scores_te.shape[-1]), jnp.int32)  # Zero-size: carries E.
  return chosen_scores(scores_te, idx_tk), (idx_tk, experts_0e)


def _chosen_bwd(res, g_tk):
  idx_tk, experts_0e = res
  hit_tke = idx_tk[..., None] == jnp.arange(experts_0e.shape[-1], dtype=idx_tk.dtype)
  return jnp.sum(jnp.where(hit_tke, g_tk[..., None], 0), axis=-2), None


chosen_scores.defvjp(_chosen_fwd, _chosen_bwd)


def routing_stats(logits_bte: jax.Array, scores_bte: jax.Array, idx_btk: jax.Array,
                  valid_bt: jax.Array, kept_btk: jax.Array | None = None) -> MoEStats:
  """Loads, sequence-wise balance loss and router z-loss over the real tokens (``valid_bt``).

  Balance loss (DeepSeek-V3, per row): f_i = N_r / (K T) * #{t: i in TopK(t)},
  P_i = mean_t s_i(t) / sum_j s_j(t), loss = sum_i f_i P_i, averaged over rows with tokens.
  """
  e, k = scores_bte.shape[-1], idx_btk.shape[-1]
  valid_bt = valid_bt.astype(jnp.float32)
  # Counted where the tokens are: left to propagation, XLA gathered every shard's chosen experts
  # onto every device and built the one-hot of the whole batch there, in every MoE layer.
  chosen_bte = constrain(jax.nn.one_hot(idx_btk, e, dtype=jnp.float32).sum(axis=-2),
                         ("batch", "length", None))
  load_e = jnp.einsum("bt,bte->e", valid_bt, chosen_bte)
  tokens_b = valid_bt.sum(axis=1)
  per_row = jnp.maximum(tokens_b, 1.0)[:, None]
  f_be = e / k * jnp.einsum("bt,bte->be", valid_bt, chosen_bte) / per_row
  probs_bte = scores_bte / jnp.sum(scores_bte, axis=-1, keepdims=True)
  p_be = jnp.einsum("bt,bte->be", valid_bt, probs_bte) / per_row
  rows = jnp.maximum(jnp.sum(tokens_b > 0), 1)
  balance = jnp.sum(jax.lax.stop_gradient(f_be) * p_be) / rows
  lse_bt = jax.nn.logsumexp(logits_bte, axis=-1)
  z = jnp.sum(valid_bt * lse_bt ** 2) / jnp.maximum(tokens_b.sum(), 1.0)
  dropped = jnp.zeros((), jnp.float32) if kept_btk is None else jnp.sum(
      valid_bt[..., None] * jnp.logical_not(kept_btk))
  return MoEStats(load_e, balance, z, tokens_b.sum(), dropped)


# ---------------------------------------------------------------------------------------------
# The experts and the layer.


def swiglu_experts(x_nd: jax.Array, sizes_e: jax.Array, wi_gate: jax.Array, wi_up: jax.Array,
                   wo: jax.Array, rate: float, rng: jax.Array | None) -> jax.Array:
  """Rows of ``x_nd`` sorted by expert (``sizes_e`` rows each) through their expert's SwiGLU;
  products in x's dtype, as ``ops.dense`` (a float32 output makes the backward products float32)."""
  gate_nf = jax.lax.ragged_dot(x_nd, wi_gate, sizes_e)
  up_nf = jax.lax.ragged_dot(x_nd, wi_up, sizes_e)
  h_nf = dropout(jax.nn.silu(gate_nf) * up_nf, rate, rng)
  return jax.lax.ragged_dot(h_nf, wo, sizes_e)


class Router(nnx.Module):
  """Affinity logits u . e_i (float32) and the selection bias b."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, e = cfg.d_model, cfg.moe.num_experts
    self.kernel = param(rngs, fan_in_init(d), (d, e), ("embed", "expert"), cfg.param_dtype)
    self.bias = RouterBias(jnp.zeros((e,), jnp.float32), out_sharding=("expert",),
                           eager_sharding=False)

  def __call__(self, x_btd: jax.Array) -> jax.Array:
    return jnp.einsum("btd,de->bte", x_btd.astype(jnp.float32),
                      self.kernel.get_value().astype(jnp.float32))


class RoutedExperts(nnx.Module):
  """N_r SwiGLU experts of width ``moe.expert_d_ff``, weights stacked on an ``expert`` axis."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, f, e = cfg.d_model, cfg.moe.expert_d_ff, cfg.moe.num_experts
    kernel = dict(param_dtype=cfg.param_dtype, cast_to_compute=True)  # Used via weights(dt).
    self.wi_gate = param(rngs, fan_in_init(d), (e, d, f), ("expert", "embed", "mlp"), **kernel)
    self.wi_up = param(rngs, fan_in_init(d), (e, d, f), ("expert", "embed", "mlp"), **kernel)
    self.wo = param(rngs, fan_in_init(f), (e, f, d), ("expert", "mlp", "embed"), **kernel)

  def weights(self, dt) -> tuple[jax.Array, jax.Array, jax.Array]:
    return tuple(w.get_value().astype(dt) for w in (self.wi_gate, self.wi_up, self.wo))

  def dropless(self, x_td: jax.Array, idx_tk: jax.Array, rate: float,
               rng: jax.Array | None) -> jax.Array:
    """[tokens, top_k, embed]: token t through each of its experts idx[t, :], none dropped."""
    t, k = idx_tk.shape
    flat_n = idx_tk.reshape(-1)
    order_n = jnp.argsort(flat_n, stable=True)  # (token, slot) pairs grouped by expert.
    sizes_e = jnp.bincount(flat_n, length=self.wi_gate.shape[0]).astype(jnp.int32)
    y_nd = swiglu_experts(x_td[order_n // k], sizes_e, *self.weights(x_td.dtype), rate, rng)
    return y_nd[jnp.argsort(order_n)].reshape(t, k, -1)


class MoEFeedForward(nnx.Module):
  """Shared experts + top-K routed experts (module docstring). Records ``self.stats``."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    m = cfg.moe
    self.cfg = cfg
    self.router = Router(cfg, rngs=rngs)
    self.experts = RoutedExperts(cfg, rngs=rngs)
    # N_s shared SwiGLUs of width f summed equal one SwiGLU of width N_s * f (hidden units concat).
    self.shared = (SwiGLU(dataclasses.replace(cfg, d_ff=m.num_shared_experts * m.expert_d_ff),
                          rngs=rngs) if m.num_shared_experts else None)

  def route(self, x_btd: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(router logits [b,t,E], scores s [b,t,E], chosen experts [b,t,K], gates g [b,t,K])."""
    m = self.cfg.moe
    logits_bte = self.router(x_btd)
    scores_bte = jax.nn.sigmoid(logits_bte)
    b, t, e = scores_bte.shape
    scores_te = scores_bte.reshape(b * t, e)
    idx_tk = select_experts(scores_te, self.router.bias.get_value(), m.top_k, m.num_groups,
                            m.top_groups)
    gates_tk = gate_values(scores_te, idx_tk, m.routed_scaling)
    return logits_bte, scores_bte, idx_tk.reshape(b, t, -1), gates_tk.reshape(b, t, -1)

  def __call__(self, x_btd: jax.Array, valid_bt: jax.Array | None = None, *,
               rng: jax.Array | None = None) -> jax.Array:
    """FFN output [b, t, d]; ``valid_bt`` marks real tokens (padding is never counted)."""
    cfg = self.cfg
    dt = dtype(cfg.dtype)
    b, t, d = x_btd.shape
    logits_bte, scores_bte, idx_btk, gates_btk = self.route(x_btd)
    if valid_bt is None:
      valid_bt = jnp.ones((b, t), jnp.bool_)
    kept_btk = None
    if cfg.moe.capacity_factor > 0:
      routed_btkd, kept_btk = capacity_experts(x_btd.astype(dt), idx_btk, valid_bt,
                                               self.experts.weights(dt), cfg.moe.capacity_factor)
      # Dropout on the experts' outputs here (their hidden units live inside the dispatch).
      routed_btkd = dropout(routed_btkd, cfg.dropout_rate, fold(rng, 0))
    else:
      routed_btkd = self.experts.dropless(x_btd.astype(dt).reshape(b * t, d),
                                          idx_btk.reshape(b * t, -1), cfg.dropout_rate,
                                          fold(rng, 0)).reshape(b, t, -1, d)
    y_btd = jnp.einsum("btk,btkd->btd", gates_btk, routed_btkd.astype(jnp.float32))
    if self.shared is not None:
      y_btd = y_btd + self.shared(x_btd, rng=fold(rng, 1)).astype(jnp.float32)
    if collecting():  # Only then: generation's persistent layers are never mutated.
      stats = routing_stats(logits_bte, scores_bte, idx_btk, valid_bt, kept_btk)
      self.stats = nnx.Intermediate(stats._replace(chosen=idx_btk) if _COLLECT.get()[1]
                                    else stats)
    return y_btd.astype(dt)


def route_dropless(model: nnx.Module) -> nnx.Module:
  """A copy of ``model`` (the same arrays) whose MoE layers all route dropless: generation and
  scoring use it. A capacity is a training device (fixed-size buffers for expert parallelism);
  at inference it would make a token's experts depend on which other tokens share its step (a
  decode step's T is its rows), so every routed pair is computed instead — the model's own
  dropless path, and the full forward's routing exactly."""
  copy = nnx.merge(*nnx.split(model))
  for _, module in nnx.iter_modules(copy):
    if isinstance(module, MoEFeedForward) and module.cfg.moe.capacity_factor > 0:
      module.cfg = dataclasses.replace(
          module.cfg, moe=dataclasses.replace(module.cfg.moe, capacity_factor=0.0))
  return copy


# Where a layer stack keeps its MoE layers' bias, below the stack's own path.
BIAS_PATH = ("layers", "mlp", "router", "bias")


def pop_layer_stats(model: nnx.Module) -> dict[tuple, MoEStats]:
  """{path of a layer stack: ``MoEStats`` of its MoE layers, [layers] leading}, taken off the
  model (recorded by a forward pass traced under ``collect_stats``). The stack's biases live at
  ``path + BIAS_PATH``."""
  popped = nnx.pop(model, nnx.Intermediate)
  return {tuple(path[:-1]): var.get_value() for path, var in nnx.to_flat_state(popped)}


def moe_layer_names(model: nnx.Module) -> dict[tuple, list[str]]:
  """{path of a layer stack with MoE layers: '<encoder|decoder>/<layer index>' of each}."""
  out = {}
  for path, _ in nnx.to_flat_state(nnx.state(model, RouterBias)):
    stack_path = tuple(path[:-len(BIAS_PATH)])
    stack = model
    for key in stack_path:
      stack = stack[key] if isinstance(key, int) else getattr(stack, key)
    out[stack_path] = [f"{stack_path[0]}/{stack.first_index + i}"
                       for i in range(stack.num_layers)]
  return out
