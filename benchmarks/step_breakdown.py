"""Where a train step's time goes: each piece of the model timed forward + backward on its own
at the step's shapes, next to the whole step, in one run.

  python benchmarks/step_breakdown.py [--config small_decllm] [--dtype float32] [--repeats 10]

Pieces (per layer, times the number of layers that run them): attention projections
(Q/K/V/output einsums), Q/K/V norms + RoPE, attention core (scores, mask, softmax, weighted
values), SwiGLU MLP, the two pre-norms; per step: embedding gather, logits + cross-entropy with
z-loss, the optimizer update (clipping, Adafactor, the finite guard). Each piece is jitted on
its own, so fusion across pieces is lost and the shares are approximate; "rest" is the whole
loss-and-gradient minus the sum of the model's pieces (residual adds, scan and layout overhead).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # A checkout.

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

from benchmarks import timing  # noqa: E402
from t5like import partitioning  # noqa: E402
from t5like.config.presets import BENCHMARK_CONFIGS as CONFIGS  # noqa: E402
from t5like.models import masks  # noqa: E402
from t5like import ops  # noqa: E402
from t5like.models.attention import Attention  # noqa: E402
from t5like.models.embedding import TiedEmbedding  # noqa: E402
from t5like.models.losses import cross_entropy_with_z_loss  # noqa: E402
from t5like.models.mlp import SwiGLU  # noqa: E402
from t5like.models.norms import RMSNorm  # noqa: E402
from t5like.training import state as state_lib  # noqa: E402
from t5like.training import step as step_lib  # noqa: E402
from t5like.training.data import SyntheticData, global_batch  # noqa: E402


def _time(fn, *args, reps: int) -> float:
  return timing.median_seconds(lambda: jax.block_until_ready(fn(*args)), reps)


def _fwd_bwd(module_fn):
  """jit of forward + backward (vjp with a constant cotangent) w.r.t. every input."""
  @jax.jit
  def step(*xs):
    out, vjp = jax.vjp(module_fn, *xs)
    return vjp(jax.tree.map(lambda o: jnp.full_like(o, 0.01), out))
  return step


def breakdown(name: str, dtype: str, reps: int) -> list[tuple[str, float]]:
  """(piece, seconds per step) rows: the model's pieces, the rest of loss-and-gradient, the
  optimizer update, and the whole train step last."""
  cfg = CONFIGS[name]()
  cfg.model.dtype = dtype
  mesh = partitioning.make_mesh(cfg.mesh)
  setup = state_lib.build_setup(cfg, mesh)
  batch = global_batch(next(SyntheticData(cfg).train(cfg.train.batch_size, 0, 1)),
                       setup.batch_sharding, cfg.train.batch_size)
  state, whole = _whole_step(setup, batch, reps)

  def loss(params, b):
    return step_lib._loss_terms(setup, params, b, None, cfg.train.z_loss).loss
  grad = jax.jit(jax.grad(loss))
  with jax.set_mesh(mesh), partitioning.axis_rules(mesh):
    loss_grad = _time(grad, state.params, batch, reps=reps)
  rows = _attention_pieces(cfg.model, batch, reps) + _other_pieces(cfg, batch, reps)
  rows.append(("rest of loss-and-gradient (adds, scan, layout)",
               max(0.0, loss_grad - sum(v for _, v in rows))))
  with jax.set_mesh(mesh), partitioning.axis_rules(mesh):
    rows.append(("optimizer update, clipping, guards (own jit)",
                 _optimizer_update(setup, state, grad(state.params, batch), reps)))
  rows.append(("whole train step", whole))
  return rows


def _whole_step(setup, batch, reps: int):
  """(the state after the timed steps, median seconds of one whole train step)."""
  train_step = step_lib.make_train_step(setup)
  box = [state_lib.init_state(setup)]  # The step donates its state: carry the new one.

  def run_step(b):
    box[0], metrics = train_step(box[0], b)
    return metrics
  whole = _time(run_step, batch, reps=reps)
  return box[0], whole


def _attention_calls(m, batch) -> list[tuple[int, int, str]]:
  """Per-layer attention calls (queries, keys, mask kind) of one forward pass: DecLLM layers (a
  prefix mask timed as bidirectional); RedLLM encoder self, decoder self + cross."""
  t = batch["decoder_input_tokens"].shape[1]
  enc_t = batch.get("encoder_input_tokens", batch["decoder_input_tokens"]).shape[1]
  if m.family == "decllm":
    kind = "causal" if m.decoder_attention == "causal" else "bidirectional"
    return [(t, t, kind)] * m.num_layers
  return ([(enc_t, enc_t, "bidirectional")] * m.num_encoder_layers
          + [(t, t, "causal")] * m.num_decoder_layers
          + [(t, enc_t, "cross")] * m.num_decoder_layers)


def _attention_pieces(m, batch, reps: int) -> list[tuple[str, float]]:
  """Projections, Q/K/V norms + RoPE and the attention core, summed over every attention call
  of a step (each distinct (queries, keys, mask) shape timed once)."""
  dt = jnp.dtype(m.dtype)
  b = batch["decoder_input_tokens"].shape[0]
  key = jax.random.key(1)
  gdef, aparams = nnx.split(Attention(m, rngs=nnx.Rngs(0)))
  cache: dict = {}
  proj = core = normrope = 0.0
  for tq, tk, kind in _attention_calls(m, batch):
    causal = kind == "causal"  # xla_cpu: query blocks skip later keys.
    if (tq, tk, kind) not in cache:
      xq = jax.random.normal(key, (b, tq, m.d_model), dt)
      xk = jax.random.normal(key, (b, tk, m.d_model), dt)
      pq = jnp.broadcast_to(jnp.arange(tq), (b, tq))
      pk = jnp.broadcast_to(jnp.arange(tk), (b, tk))
      seg_q, seg_k = jnp.ones((b, tq), jnp.int32), jnp.ones((b, tk), jnp.int32)
      mask = (masks.cross_attention_mask(seg_q, seg_k) if kind == "cross"
              else masks.self_attention_mask(seg_q, kind=kind))
      q = jax.random.normal(key, (b, tq, m.num_heads, m.head_dim), dt)
      k = jax.random.normal(key, (b, tk, m.kv_heads, m.head_dim), dt)

      def projections(p, xq, xk):
        a = nnx.merge(gdef, p)
        d = a.ops.dense(xq, a.wq[...].astype(dt))
        kk = a.ops.dense(xk, a.wk[...].astype(dt))
        vv = a.ops.dense(xk, a.wv[...].astype(dt))
        return a.project_out(d) + jnp.sum(kk) + jnp.sum(vv)

      def norm_rope(p, q, k):
        a = nnx.merge(gdef, p)
        return a.norm_rope(q, "q_norm", pq), a.norm_rope(k, "k_norm", pk), a.norm_rope(
            k, "v_norm", None)

      def attention_core(q, k, v):
        return ops.backend(m).attention(q, k, v, mask, causal=causal)
      cache[(tq, tk, kind)] = (
          _time(_fwd_bwd(projections), aparams, xq, xk, reps=reps),
          _time(_fwd_bwd(norm_rope), aparams, q, k, reps=reps),
          _time(_fwd_bwd(attention_core), q, k, k, reps=reps))
    p_, n_, c_ = cache[(tq, tk, kind)]
    proj, normrope, core = proj + p_, normrope + n_, core + c_
  return [("attention projections (Q/K/V/out)", proj), ("Q/K/V norms + RoPE", normrope),
          ("attention core (scores, mask, softmax, PV)", core)]


def _other_pieces(cfg, batch, reps: int) -> list[tuple[str, float]]:
  """The SwiGLU MLPs, the pre-norms, logits + loss and the embedding gathers of one step."""
  m = cfg.model
  b, t = batch["decoder_input_tokens"].shape
  rngs = nnx.Rngs(0)
  x = jax.random.normal(jax.random.key(1), (b, t, m.d_model), jnp.dtype(m.dtype))
  attn_calls = len(_attention_calls(m, batch))
  mlp_calls = (m.num_layers if m.family == "decllm"
               else m.num_encoder_layers + m.num_decoder_layers)
  g, mp = nnx.split(SwiGLU(m, rngs=rngs))
  rows = [("SwiGLU MLP", mlp_calls * _time(_fwd_bwd(lambda p, x: nnx.merge(g, p)(x)), mp, x,
                                           reps=reps))]
  g, np_ = nnx.split(RMSNorm((m.d_model,), ("embed",), eps=m.norm_eps,
                             param_dtype=m.param_dtype, ops=ops.backend(m), rngs=rngs))
  norms = attn_calls + mlp_calls + (2 if m.family == "redllm" else 1)
  rows.append(("RMSNorm pre-norms", norms * _time(_fwd_bwd(lambda p, x: nnx.merge(g, p)(x)), np_,
                                                  x, reps=reps)))
  g, ep = nnx.split(TiedEmbedding(m, rngs=rngs))
  targets, tokens = batch["decoder_target_tokens"], batch["decoder_input_tokens"]

  def logits_loss(p, x):
    e = nnx.merge(g, p)
    return cross_entropy_with_z_loss(e.logits(x), targets, None, cfg.train.z_loss).loss
  rows.append(("logits + cross-entropy (tied table)",
               _time(_fwd_bwd(logits_loss), ep, x, reps=reps)))
  rows.append(("embedding gather", (2 if m.family == "redllm" else 1) * _time(
      _fwd_bwd(lambda p: nnx.merge(g, p).embed(tokens)), ep, reps=reps)))
  return rows


def _optimizer_update(setup, state, grads, reps: int) -> float:
  """The optimizer update with clipping and the finite guard, timed on its own: "whole step -
  loss/grad" differs two separately compiled programs and swung by tens of ms (it read 26 % of
  a tiny step whose update alone takes ~6 ms)."""
  def update(params, opt_state, g):
    updates, new_opt = setup.tx.update(g, opt_state, params)
    new = jax.tree.map(lambda p, u: p + (1e-3 * u).astype(p.dtype), params, updates)
    return new, new_opt, state_lib.all_finite(new), optax.tree.norm(g)
  return _time(jax.jit(update), state.params, state.opt_state, grads, reps=reps)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--config", default="small_decllm", choices=sorted(CONFIGS))
  timing.add_dtype_flag(ap, "float32")
  timing.add_repeats_flag(ap, 10, "timed calls of each piece")
  args = ap.parse_args()
  rows = breakdown(args.config, args.dtype, args.repeats)
  whole = rows[-1][1]
  print(f"{args.config} ({args.dtype}), fwd+bwd per step, {jax.devices()[0].device_kind}")
  print(f"| piece | ms per step | share of step |\n|---|---|---|")
  for name, sec in rows:
    print(f"| {name} | {sec * 1e3:.1f} | {sec / whole:.0%} |")


if __name__ == "__main__":
  from t5like import runtime
  main()
