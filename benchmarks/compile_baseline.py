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

With ``model.moe``, each stack's leading dense layers are one scan and its mixture-of-experts
layers another, as the config's layer flags say. An MoE layer's feed-forward is the textbook
one-hot form (GShard's, MaxText's ``dense_matmul``): sigmoid router, top-K gates normalised over
the K, each sequence's tokens placed in the experts' buffers of ``capacity_factor`` by a running
count, dispatched and combined by einsums against the one-hot buffer places, the experts' SwiGLUs
batched, plus the shared experts. The experts go over ``mesh.expert`` (the batch over
``expert`` x ``fsdp``, dense weights over both). No group-limited routing, balancing bias or
balance loss.
"""
from __future__ import annotations

import itertools
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from t5like import partitioning
from t5like.config import moe as moe_config


def f32(*shape: int) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(shape, jnp.float32)


def _stack(m, layers: int, cross: bool, moe: bool = False) -> dict:
  """``layers`` stacked layers' weights; with ``cross``, a cross-attention's too; with ``moe``,
  a router, routed experts and shared experts instead of the SwiGLU."""
  L, D, H, K, F = layers, m.d_model, m.num_heads, m.head_dim, m.d_ff

  def attn(pre: str) -> dict:
    return {pre + n: f32(L, D, H, K) for n in "qkv"} | {pre + "o": f32(L, H, K, D)}

  if moe:
    E, F = m.moe.num_experts, m.moe.expert_d_ff
    ffn = {"router": f32(L, D, E), "expert_wi": f32(L, E, D, F), "expert_wg": f32(L, E, D, F),
           "expert_wout": f32(L, E, F, D)}
    F *= m.moe.num_shared_experts
    ffn |= {"wi": f32(L, D, F), "wg": f32(L, D, F), "wout": f32(L, F, D)} if F else {}
  else:
    ffn = {"wi": f32(L, D, F), "wg": f32(L, D, F), "wout": f32(L, F, D)}
  layer = {**attn("self_"), **ffn, "norm1": f32(L, D), "norm2": f32(L, D)}
  return layer | ({**attn("cross_"), "norm_x": f32(L, D)} if cross else {})


def _runs(m, stack: str, layers: int, cross: bool) -> dict:
  """A stack's runs of alike layers in order (``moe_config.stack_moe_flags``), each stacked."""
  flags = moe_config.stack_moe_flags(m.moe, stack, layers)
  runs = [(moe, len(list(group))) for moe, group in itertools.groupby(flags)]
  return {f"{i}_{'moe' if moe else 'dense'}": _stack(m, n, cross, moe)
          for i, (moe, n) in enumerate(runs)}


def _params(m) -> dict:
  out = {"embed": f32(m.vocab_size, m.d_model), "final_norm": f32(m.d_model)}
  if m.family == "redllm":
    return out | {"encoder": _runs(m, "encoder", m.num_encoder_layers, False),
                  "decoder": _runs(m, "decoder", m.num_decoder_layers, True),
                  "encoder_norm": f32(m.d_model)}
  return out | {"layers": _runs(m, "decoder", m.num_layers, False)}


def _sharding(mesh: Mesh, path, x) -> NamedSharding:
  """A routed expert's weights: experts over ``expert``, the larger of the other two dims over
  ``fsdp``. Other weights: the largest dimension divisible by the device count over all devices;
  else replicated."""
  spec = [None] * len(x.shape)
  if "expert" in mesh.axis_names and "expert_" in jax.tree_util.keystr(path) and x.ndim > 2:
    spec[1] = "expert"  # [layers, experts, ...] (their factored Adafactor statistics too).
    n, axis, dims = mesh.shape["fsdp"], "fsdp", range(2, len(x.shape))
  else:
    n, axis, dims = mesh.devices.size, _batch_axes(mesh), range(len(x.shape))
  dims = [i for i in dims if x.shape[i] % n == 0 and len(x.shape) > 1]
  if dims:
    spec[max(dims, key=lambda i: x.shape[i])] = axis
  return NamedSharding(mesh, P(*spec))


def _batch_axes(mesh: Mesh):
  """The axes the batch (and every dense weight) is split over: all of the mesh's."""
  return mesh.axis_names if len(mesh.axis_names) > 1 else mesh.axis_names[0]


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


def _moe(h, p, mesh, moe):
  """Routed experts (one-hot dispatch into per-sequence buffers of fixed capacity) on [B, S, D]."""
  B, S, _ = h.shape
  E, K = moe.num_experts, moe.top_k
  C = min(S, math.ceil((moe.capacity_factor or E / K) * S * K / E))  # 0 (dropless): no drops.
  scores = jax.nn.sigmoid(jnp.einsum("bsd,de->bse", h, p["router"]).astype(jnp.float32))
  top, chosen = jax.lax.top_k(scores, K)
  hot = jax.nn.one_hot(chosen, E, dtype=jnp.float32)  # [B, S, K, E]
  gate = jnp.einsum("bsk,bske->bse", top / top.sum(-1, keepdims=True), hot)
  routed = hot.sum(2)  # [B, S, E]: 1 where the token chose the expert.
  place = jnp.cumsum(routed, axis=1) * routed - 1  # Its place in the expert's buffer (-1: none).
  tokens = NamedSharding(mesh, P(_batch_axes(mesh)))  # Each row's buffers where its tokens are.
  dispatch = jax.lax.with_sharding_constraint(  # [B, S, E, C]; places >= C drop.
      jax.nn.one_hot(place.astype(jnp.int32), C, dtype=h.dtype), tokens)
  experts = NamedSharding(mesh, P("expert", "fsdp") if "expert" in mesh.axis_names else P())
  x = jax.lax.with_sharding_constraint(jnp.einsum("bsec,bsd->ebcd", dispatch, h), experts)
  x = jax.nn.silu(jnp.einsum("ebcd,edf->ebcf", x, p["expert_wg"])) * jnp.einsum(
      "ebcd,edf->ebcf", x, p["expert_wi"])
  x = jax.lax.with_sharding_constraint(jnp.einsum("ebcf,efd->ebcd", x, p["expert_wout"]), experts)
  combine = jax.lax.with_sharding_constraint(dispatch * gate.astype(h.dtype)[..., None], tokens)
  return jnp.einsum("ebcd,bsec->bsd", x, combine)


def _layer(x, p, mesh, causal: bool = True, memory=None, moe=None):
  """One pre-norm layer: self-attention, the cross-attention when there is a ``memory`` (the
  decoder's queries at positions after the encoder's), SwiGLU (with a router: plus the routed
  experts, the SwiGLU being the shared experts)."""
  p = jax.tree.map(lambda a: a.astype(x.dtype), p)
  h = _rms(x, p["norm1"])
  x = x + _attention(h, h, p, "self_", causal)
  if memory is not None:
    h = _rms(x, p["norm_x"])
    x = x + _attention(h, memory, p, "cross_", False, q_offset=memory.shape[1])
  h = _rms(x, p["norm2"])
  if "wi" in p:
    x = x + (jax.nn.silu(h @ p["wg"]) * (h @ p["wi"])) @ p["wout"]
  if "router" in p:
    x = x + _moe(h, p, mesh, moe)
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(_batch_axes(mesh)))), None


def _scan(x, runs, mesh, **kw):
  """The stack's runs one after the other, each a scan over its stacked layers."""
  for _, stack in sorted(runs.items(), key=lambda kv: int(kv[0].split("_")[0])):
    x = jax.lax.scan(jax.checkpoint(lambda x, p: _layer(x, p, mesh, **kw)), x, stack)[0]
  return x


def _loss(params, batch, mesh, dt, moe):
  """Mean cross-entropy of the tied logits for the next token: of the tokens (DecLLM), of the
  targets (RedLLM)."""
  embed = params["embed"].astype(dt)
  if "encoder" in params:
    memory = _rms(_scan(embed[batch[0]], params["encoder"], mesh, causal=False, moe=moe),
                  params["encoder_norm"])
    x, labels = _scan(embed[batch[1]], params["decoder"], mesh, memory=memory, moe=moe), batch[1]
  else:
    x, labels = _scan(embed[batch[0]], params["layers"], mesh, moe=moe), batch[0]
  logits = jnp.einsum("btd,vd->btv", _rms(x, params["final_norm"]), embed)
  return optax.softmax_cross_entropy_with_integer_labels(  # The shapes of a shifted batch.
      logits.astype(jnp.float32), jnp.roll(labels, -1, axis=1)).mean()


def measure(cfg, devices) -> dict:
  """Lower and compile the plain step for ``cfg.model`` and ``cfg.train.batch_size`` rows of
  ``cfg.data.sequence_length`` tokens (DecLLM) or ``inputs_length`` + ``targets_length`` (RedLLM)
  on ``devices``: seconds (wall and CPU) and the lowered and compiled programs."""
  m, d = cfg.model, cfg.data
  experts = cfg.mesh.expert if m.moe.enabled and cfg.mesh.expert > 1 else 1
  mesh = (Mesh(np.array(devices).reshape(experts, -1), ("expert", "fsdp")) if experts > 1
          else Mesh(np.array(devices), ("fsdp",)))
  params = _params(m)
  dt = jnp.dtype(m.dtype)
  tx = optax.adafactor(1e-3)

  def step(params, opt_state, batch):
    value, grads = jax.value_and_grad(_loss)(params, batch, mesh, dt, m.moe)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value

  opt_state = jax.eval_shape(tx.init, params)
  shard = lambda tree: jax.tree_util.tree_map_with_path(  # noqa: E731
      lambda path, x: _sharding(mesh, path, x), tree)
  lengths = (d.inputs_length, d.targets_length) if m.family == "redllm" else (d.sequence_length,)
  batch = tuple(jax.ShapeDtypeStruct((cfg.train.batch_size, n), jnp.int32) for n in lengths)
  data = tuple(NamedSharding(mesh, P(_batch_axes(mesh))) for _ in lengths)
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
