"""A plain scanned train step at a config's shapes: the floor ``compile_time.py`` compares the
trainer's step with (``--baseline``).

DecLLM: embedding, ``lax.scan`` over ``jax.checkpoint``-ed decoder layers (RMSNorm, q/k/v
projections, RoPE, one masked softmax attention, output projection, RMSNorm, SwiGLU; the residual
stream's batch over ``fsdp``), tied logits, mean cross-entropy, ``optax.adafactor``. RedLLM: the
same encoder layers (bidirectional) over the inputs, then decoder layers that add a
cross-attention to the encoder's output (RoPE at continuous positions) over the targets.
Parameters and batch sharded over one ``fsdp`` axis of every device. No q/k/v or attention-output
norm, z-loss, dropout, clipping, microbatches, skip guard or metrics: what any such model's train
step has, so the difference to the trainer's step is what t5like adds, and the ratio of the two
families' floors is what their architectures cost at those lengths.
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from t5like import partitioning


def f32(*shape: int) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(shape, jnp.float32)


def _stack(m, layers: int, cross: bool) -> dict:
  """``layers`` stacked layers' weights; with ``cross``, a cross-attention's too."""
  L, D, H, K, F = layers, m.d_model, m.num_heads, m.head_dim, m.d_ff

  def attn(pre: str) -> dict:
    return {pre + n: f32(L, D, H, K) for n in "qkv"} | {pre + "o": f32(L, H, K, D)}

  layer = {**attn("self_"), "wi": f32(L, D, F), "wg": f32(L, D, F), "wout": f32(L, F, D),
           "norm1": f32(L, D), "norm2": f32(L, D)}
  return layer | ({**attn("cross_"), "norm_x": f32(L, D)} if cross else {})


def _params(m) -> dict:
  out = {"embed": f32(m.vocab_size, m.d_model), "final_norm": f32(m.d_model)}
  if m.family == "redllm":
    return out | {"encoder": _stack(m, m.num_encoder_layers, False),
                  "decoder": _stack(m, m.num_decoder_layers, True),
                  "encoder_norm": f32(m.d_model)}
  return out | {"layers": _stack(m, m.num_layers, False)}


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


def _rope(x, offset: int = 0):
  t, k = x.shape[1], x.shape[-1]
  angle = (offset + jnp.arange(t))[:, None] / (10_000.0 ** (jnp.arange(0, k, 2) / k))
  sin, cos = (f(angle).astype(x.dtype)[None, :, None] for f in (jnp.sin, jnp.cos))
  x1, x2 = x[..., ::2], x[..., 1::2]
  return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


def _attention(h, kv, p, pre: str, causal: bool, kv_offset: int = 0, q_offset: int = 0):
  q, k, v = (jnp.einsum("btd,dhk->bthk", x, p[pre + n])
             for x, n in ((h, "q"), (kv, "k"), (kv, "v")))
  scores = jnp.einsum("bqhk,bshk->bhqs", _rope(q, q_offset), _rope(k, kv_offset))
  scores = scores.astype(jnp.float32) * q.shape[-1] ** -0.5
  if causal:
    scores = jnp.where(jnp.tril(jnp.ones((h.shape[1], kv.shape[1]), bool)), scores, -1e9)
  a = jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(scores, -1).astype(h.dtype), v)
  return jnp.einsum("bqhk,hkd->bqd", a, p[pre + "o"])


def _layer(x, p, mesh, causal: bool = True, memory=None):
  """One pre-norm layer: self-attention, the cross-attention when there is a ``memory`` (the
  decoder's queries at positions after the encoder's), SwiGLU."""
  p = jax.tree.map(lambda a: a.astype(x.dtype), p)
  h = _rms(x, p["norm1"])
  x = x + _attention(h, h, p, "self_", causal)
  if memory is not None:
    h = _rms(x, p["norm_x"])
    x = x + _attention(h, memory, p, "cross_", False, q_offset=memory.shape[1])
  h = _rms(x, p["norm2"])
  x = x + (jax.nn.silu(h @ p["wg"]) * (h @ p["wi"])) @ p["wout"]
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P("fsdp"))), None


def _scan(x, stack, mesh, **kw):
  return jax.lax.scan(jax.checkpoint(lambda x, p: _layer(x, p, mesh, **kw)), x, stack)[0]


def _loss(params, batch, mesh, dt):
  """Mean cross-entropy of the tied logits for the next token: of the tokens (DecLLM), of the
  targets (RedLLM)."""
  embed = params["embed"].astype(dt)
  if "encoder" in params:
    memory = _rms(_scan(embed[batch[0]], params["encoder"], mesh, causal=False),
                  params["encoder_norm"])
    x, labels = _scan(embed[batch[1]], params["decoder"], mesh, memory=memory), batch[1]
  else:
    x, labels = _scan(embed[batch[0]], params["layers"], mesh), batch[0]
  logits = jnp.einsum("btd,vd->btv", _rms(x, params["final_norm"]), embed)
  return optax.softmax_cross_entropy_with_integer_labels(  # The shapes of a shifted batch.
      logits.astype(jnp.float32), jnp.roll(labels, -1, axis=1)).mean()


def measure(cfg, devices) -> dict:
  """Lower and compile the plain step for ``cfg.model`` and ``cfg.train.batch_size`` rows of
  ``cfg.data.sequence_length`` tokens (DecLLM) or ``inputs_length`` + ``targets_length`` (RedLLM)
  on ``devices``: seconds (wall and CPU) and the lowered and compiled programs."""
  m, d = cfg.model, cfg.data
  mesh = Mesh(np.array(devices), ("fsdp",))
  params = _params(m)
  dt = jnp.dtype(m.dtype)
  tx = optax.adafactor(1e-3)

  def step(params, opt_state, batch):
    value, grads = jax.value_and_grad(_loss)(params, batch, mesh, dt)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value

  opt_state = jax.eval_shape(tx.init, params)
  shard = lambda tree: jax.tree.map(lambda x: _sharding(mesh, x), tree)  # noqa: E731
  lengths = (d.inputs_length, d.targets_length) if m.family == "redllm" else (d.sequence_length,)
  batch = tuple(jax.ShapeDtypeStruct((cfg.train.batch_size, n), jnp.int32) for n in lengths)
  data = tuple(NamedSharding(mesh, P("fsdp")) for _ in lengths)
  fn = jax.jit(step, in_shardings=(shard(params), shard(opt_state), data),
               out_shardings=(shard(params), shard(opt_state), NamedSharding(mesh, P())),
               donate_argnums=(0, 1),  # The trainer's collective options (SparseCores).
               compiler_options=partitioning.compiler_options(cfg.mesh, mesh))
  t0, c0 = time.perf_counter(), time.process_time()
  lowered = fn.lower(params, opt_state, batch)
  t1, c1 = time.perf_counter(), time.process_time()
  compiled = lowered.compile()
  t2, c2 = time.perf_counter(), time.process_time()
  return {"lower_s": t1 - t0, "compile_s": t2 - t1, "trace_lower_cpu_s": c1 - c0,
          "compile_cpu_s": c2 - c1, "lowered": lowered, "compiled": compiled}
