"""A plain scanned decoder train step at a config's shapes: the floor ``compile_time.py``
compares the trainer's step with (``--baseline``).

Embedding, ``lax.scan`` over ``jax.checkpoint``-ed layers (RMSNorm, q/k/v projections, RoPE,
one masked softmax attention, output projection, RMSNorm, SwiGLU; the residual stream's batch
over ``fsdp``), tied logits, mean
cross-entropy, ``optax.adafactor``; parameters and the batch sharded over one ``fsdp`` axis of
every device. No q/k/v norm, z-loss, clipping, microbatches, skip guard or metrics: what any
decoder's train step has, so the difference to the trainer's step is what t5like adds.
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from t5like import partitioning


def _params(m) -> dict:
  f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)  # noqa: E731
  L, D, H, K, F = m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff
  layer = {"wq": f32(L, D, H, K), "wk": f32(L, D, H, K), "wv": f32(L, D, H, K),
           "wo": f32(L, H, K, D), "wi": f32(L, D, F), "wg": f32(L, D, F), "wout": f32(L, F, D),
           "norm1": f32(L, D), "norm2": f32(L, D)}
  return {"embed": f32(m.vocab_size, D), "layers": layer, "final_norm": f32(D)}


def _sharding(mesh: Mesh, x) -> NamedSharding:
  """The largest dimension divisible by the device count goes over ``fsdp``; else replicated."""
  n = mesh.devices.size
  dims = [i for i, d in enumerate(x.shape) if d % n == 0 and len(x.shape) > 1]
  spec = [None] * len(x.shape)
  if dims:
    spec[max(dims, key=lambda i: x.shape[i])] = "fsdp"
  return NamedSharding(mesh, P(*spec))


def _rms(x, g):
  r = jax.lax.rsqrt(jnp.mean(jnp.square(x.astype(jnp.float32)), -1, keepdims=True) + 1e-6)
  return (x * r.astype(x.dtype)) * g.astype(x.dtype)


def _rope(x):
  t, k = x.shape[1], x.shape[-1]
  angle = jnp.arange(t)[:, None] / (10_000.0 ** (jnp.arange(0, k, 2) / k))
  sin, cos = (f(angle).astype(x.dtype)[None, :, None] for f in (jnp.sin, jnp.cos))
  x1, x2 = x[..., ::2], x[..., 1::2]
  return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


def _layer(x, p, mesh):
  p = jax.tree.map(lambda a: a.astype(x.dtype), p)
  h = _rms(x, p["norm1"])
  q, k, v = (jnp.einsum("btd,dhk->bthk", h, p[n]) for n in ("wq", "wk", "wv"))
  scores = jnp.einsum("bqhk,bshk->bhqs", _rope(q), _rope(k)).astype(jnp.float32)
  t = x.shape[1]
  scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores * q.shape[-1] ** -0.5, -1e9)
  a = jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(scores, -1).astype(x.dtype), v)
  x = x + jnp.einsum("bqhk,hkd->bqd", a, p["wo"])
  h = _rms(x, p["norm2"])
  x = x + (jax.nn.silu(h @ p["wg"]) * (h @ p["wi"])) @ p["wout"]
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P("fsdp"))), None


def measure(cfg, devices) -> dict:
  """Lower and compile the plain step for ``cfg.model`` / ``cfg.train.batch_size`` x
  ``cfg.data.sequence_length`` on ``devices``: seconds (wall and CPU) and HLO op count."""
  m = cfg.model
  mesh = Mesh(np.array(devices), ("fsdp",))
  params = _params(m)
  dt = jnp.dtype(m.dtype)
  tx = optax.adafactor(1e-3)

  def loss(params, tokens):
    x = params["embed"].astype(dt)[tokens]
    x, _ = jax.lax.scan(jax.checkpoint(lambda x, p: _layer(x, p, mesh)), x, params["layers"])
    logits = jnp.einsum("btd,vd->btv", _rms(x, params["final_norm"]), params["embed"].astype(dt))
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32),
                                                           tokens).mean()

  def step(params, opt_state, tokens):
    value, grads = jax.value_and_grad(loss)(params, tokens)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value

  opt_state = jax.eval_shape(tx.init, params)
  shard = lambda tree: jax.tree.map(lambda x: _sharding(mesh, x), tree)  # noqa: E731
  tokens = jax.ShapeDtypeStruct((cfg.train.batch_size, cfg.data.sequence_length), jnp.int32)
  data = NamedSharding(mesh, P("fsdp"))
  fn = jax.jit(step, in_shardings=(shard(params), shard(opt_state), data),
               out_shardings=(shard(params), shard(opt_state), NamedSharding(mesh, P())),
               donate_argnums=(0, 1),  # The trainer's collective options (SparseCores).
               compiler_options=partitioning.compiler_options(cfg.mesh, mesh))
  t0, c0 = time.perf_counter(), time.process_time()
  lowered = fn.lower(params, opt_state, tokens)
  t1, c1 = time.perf_counter(), time.process_time()
  compiled = lowered.compile()
  t2, c2 = time.perf_counter(), time.process_time()
  return {"lower_s": t1 - t0, "compile_s": t2 - t1, "trace_lower_cpu_s": c1 - c0,
          "compile_cpu_s": c2 - c1, "lowered": lowered, "compiled": compiled}
