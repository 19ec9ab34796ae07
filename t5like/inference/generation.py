"""``generate``: batched KV-cache generation for DecLLM and RedLLM, one jitted call per batch.

Rows of different prompt lengths share fixed shapes: DecLLM rows are ``[0] + prompt`` (seqio's
shifted decoder input, BOS = 0) left-padded, so every row writes its next token into the same
cache slot, with positions 0..n counted from each row's own start; RedLLM prompts go right-padded
to ``RedLLM.encode`` as in training, the decoder starts from BOS at position = that row's
encoder length (continuous positions). Prefill, then a ``lax.while_loop`` of one-token steps that
stops when every row has produced ``eos_id`` or after ``max_new_tokens``.

A ``Generator`` unstacks the decoder's layers once (``steps.decode_layout``) and serves many
calls from them; ``generate`` is a one-call Generator.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jax.experimental import multihost_utils

from t5like import partitioning
from t5like.inference import steps
from t5like.inference.sampling import SamplingConfig, sample
from t5like import ops

PAD_MULTIPLE = 16  # Prompt lengths are rounded up to this (fewer distinct compilations).
MAX_LENGTH = 4096  # Default cache limit per row: prompt (+ BOS) + new tokens.


@dataclasses.dataclass(frozen=True)
class _Plan:
  """Static shape of one generation call (one compilation per distinct plan)."""
  family: str
  prompt_len: int  # Padded prompt length (DecLLM: with BOS).
  max_new_tokens: int
  eos_id: int
  sampling: SamplingConfig


def _check(cfg, prompts, max_new_tokens: int, max_length: int, sampling: SamplingConfig,
           rng) -> list[list[int]]:
  sampling.validate()
  if not sampling.greedy and rng is None:
    raise ValueError("sampling with temperature > 0 needs an explicit `rng` (jax.random.key)")
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
  rows = [list(map(int, p)) for p in prompts]
  if not rows:
    raise ValueError("generate needs at least one prompt")
  extra = 1 if cfg.family == "decllm" else 0  # DecLLM rows start with BOS.
  for i, p in enumerate(rows):
    if not p:
      raise ValueError(f"prompt {i} is empty; give at least one token")
    bad = [t for t in p if not 0 < t < cfg.vocab_size]
    if bad:
      raise ValueError(f"prompt {i} has token ids {bad[:5]} outside [1, {cfg.vocab_size}) "
                       "(0 is padding; the model's vocab_size is the limit)")
    if len(p) + extra + max_new_tokens > max_length:
      raise ValueError(
          f"prompt {i} has {len(p)} tokens; with {max_new_tokens} new tokens it needs "
          f"{len(p) + extra + max_new_tokens} cache slots > max_length={max_length}; shorten "
          "the prompt, lower max_new_tokens or raise max_length")
  return rows


def _pad_inputs(rows: list[list[int]], family: str, batch: int) -> tuple[np.ndarray, int]:
  """[batch, P] tokens: DecLLM ``[0] + prompt`` left-padded, RedLLM prompt right-padded."""
  bos = 1 if family == "decllm" else 0
  seqs = [[0] * bos + r for r in rows]
  seqs += [seqs[0]] * (batch - len(seqs))  # Filler rows (mesh divisibility), dropped after.
  # The prompt is rounded up, then BOS added: a 128-token prompt prefills 129 positions, not 144.
  p = -(-(max(map(len, seqs)) - bos) // PAD_MULTIPLE) * PAD_MULTIPLE + bos
  out = np.zeros((batch, p), np.int32)
  for i, s in enumerate(seqs):
    if family == "decllm":
      out[i, p - len(s):] = s
    else:
      out[i, :len(s)] = s
  lens = np.asarray([len(s) for s in seqs], np.int32)
  return out, lens


def _prefill(model, plan: _Plan, tokens_bp, lens_b):
  """(logits of the first new token, decode state, next-step fn of (token, t, state))."""
  b, p = tokens_bp.shape
  m = plan.max_new_tokens
  if plan.family == "decllm":
    start_b = p - lens_b
    idx_p = jnp.arange(p)[None, :]
    segment_ids_bp = (idx_p >= start_b[:, None]).astype(jnp.int32)
    positions_bp = jnp.maximum(idx_p - start_b[:, None], 0).astype(jnp.int32)
    logits, state = steps.decllm_prefill(model, tokens_bp, segment_ids_bp, positions_bp,
                                         p + m - 1)
    # Token t (t >= 1) is fed at slot p + t - 1, position len + t - 1.
    step = lambda y, t, c, live=None: steps.decllm_decode(  # noqa: E731
        model, y, lens_b + t - 1, p + t - 1, c, live)
    return logits, state, step
  enc_len_b = jnp.sum(tokens_bp > 0, axis=1).astype(jnp.int32)
  pos0_b = enc_len_b if model.cfg.continuous_positions else jnp.zeros_like(lens_b)
  logits, state = steps.redllm_prefill(model, tokens_bp, pos0_b, m)
  step = lambda y, t, c, live=None: steps.redllm_decode(  # noqa: E731
      model, y, pos0_b + t, t, c, live)
  return logits, state, step


def _run(graphdef, plan: _Plan, params, tokens_bp, lens_b, rng, real_b=None):
  """Jitted body: prefill, first token, then a while loop; returns tokens [batch, new]. A step's
  tokens of finished rows and of filler rows (``real_b`` false; default none) are not counted as
  tokens (MoE loads)."""
  if real_b is None:
    real_b = jnp.ones(tokens_bp.shape[:1], bool)
  model = nnx.merge(graphdef, params)
  logits, state, step = _prefill(model, plan, tokens_bp, lens_b)
  backend = ops.backend(model.cfg)
  key = lambda t: None if rng is None else jax.random.fold_in(rng, t)  # noqa: E731
  y_b = sample(logits, key(0), plan.sampling, backend)
  out_bm = jnp.zeros((tokens_bp.shape[0], plan.max_new_tokens), jnp.int32).at[:, 0].set(y_b)

  def cond(carry):
    t, _, _, done_b, _ = carry
    return (t < plan.max_new_tokens) & ~jnp.all(done_b)

  def body(carry):
    t, y_b, out_bm, done_b, state = carry
    logits, state = step(y_b, t, state, real_b & ~done_b)
    y_b = sample(logits, key(t), plan.sampling, backend)
    out_bm = jax.lax.dynamic_update_slice(out_bm, y_b[:, None], (0, t))
    return t + 1, y_b, out_bm, done_b | (y_b == plan.eos_id), state

  carry = (jnp.int32(1), y_b, out_bm, y_b == plan.eos_id, state)
  return jax.lax.while_loop(cond, body, carry)[2]


_COMPILED: dict = {}


def _compiled(cfg, graphdef, module_types: frozenset, plan: _Plan):
  # What the graphdef follows from (it does not hash): the config and the modules' classes.
  key = (repr(cfg), module_types, plan)
  if key not in _COMPILED:
    _COMPILED[key] = jax.jit(lambda *a: _run(graphdef, plan, *a))
  return _COMPILED[key]


@nnx.jit
def _decode_layout(model):
  return steps.decode_layout(model)


def _place_params(model, mesh: Mesh):
  """The model's parameters placed by the training rule table (a pure dict)."""
  state = nnx.state(model)
  axes = jax.tree.map(lambda v: tuple(v.get_metadata().get("out_sharding") or
                                      (None,) * v.value.ndim),
                      state, is_leaf=lambda x: isinstance(x, nnx.Variable))
  pure, pure_axes = nnx.to_pure_dict(state), nnx.to_pure_dict(axes)
  partitioning.check_divisible(pure_axes, pure, mesh, allow_replication=True)  # Logged.
  return jax.device_put(pure, partitioning.tree_shardings(pure_axes, pure, mesh))


class Generator:
  """Generation from one model's parameters, its decoder's layers unstacked once for many calls.

  ``steps.decode_layout`` copies every decoder layer's weights out of the stacked
  ``[layers, ...]`` arrays (a bf16 model's dense kernels and embedding tables, everywhere, in
  bf16); a Generator holds them (one more copy of the decoder's weights, and for a bf16 model a
  half-size copy of the rest's) until it is dropped; build a new one after the model's
  parameters change.
  """

  def __init__(self, model, mesh: Mesh | None = None):
    self.cfg = model.cfg
    self.mesh = mesh
    if mesh is None:
      layout = _decode_layout(model)
    else:
      placed = nnx.merge(nnx.graphdef(model), _place_params(model, mesh))
      with self._on_mesh():
        layout = _decode_layout(placed)
    self._graphdef, state = nnx.split(layout)
    self._params = nnx.to_pure_dict(state)
    self._module_types = frozenset(type(m) for _, m in nnx.iter_modules(layout))

  def _on_mesh(self):
    return contextlib.nullcontext() if self.mesh is None else _mesh_context(self.mesh)

  def __call__(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, eos_id: int = 1,
               sampling: SamplingConfig = SamplingConfig(), rng: jax.Array | None = None,
               max_length: int = MAX_LENGTH) -> list[list[int]]:
    """New tokens of each prompt, cut before ``eos_id`` (at most ``max_new_tokens`` each); the
    arguments as in ``generate``."""
    rows = _check(self.cfg, prompts, max_new_tokens, max_length, sampling, rng)
    shards = partitioning.data_shards(self.mesh) if self.mesh is not None else 1
    batch = -(-len(rows) // shards) * shards
    tokens, lens = _pad_inputs(rows, self.cfg.family, batch)
    real = np.arange(batch) < len(rows)
    plan = _Plan(self.cfg.family, tokens.shape[1], max_new_tokens, eos_id, sampling)
    fn = _compiled(self.cfg, self._graphdef, self._module_types, plan)
    if self.mesh is None:
      tokens, lens, real = jnp.asarray(tokens), jnp.asarray(lens), jnp.asarray(real)
    else:
      rows_sharding = partitioning.batch_sharding(self.mesh)
      tokens = jax.device_put(tokens, rows_sharding)
      per_row = NamedSharding(self.mesh, PartitionSpec(rows_sharding.spec[0]))
      lens, real = jax.device_put(lens, per_row), jax.device_put(real, per_row)
    with self._on_mesh():
      out = fn(self._params, tokens, lens, rng, real)
    if not out.is_fully_addressable:  # Rows on several processes: every host reads them all.
      out = multihost_utils.process_allgather(out, tiled=True)
    result = []
    for row in np.asarray(out)[:len(rows)].tolist():
      result.append(row[:row.index(eos_id)] if eos_id in row else row)
    return result


@contextlib.contextmanager
def _mesh_context(mesh: Mesh):
  with jax.set_mesh(mesh), partitioning.axis_rules(mesh):
    yield


def generate(model, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, eos_id: int = 1,
             sampling: SamplingConfig = SamplingConfig(), rng: jax.Array | None = None,
             mesh: Mesh | None = None, max_length: int = MAX_LENGTH) -> list[list[int]]:
  """New tokens of each prompt, cut before ``eos_id`` (at most ``max_new_tokens`` each).

  One call of a fresh ``Generator`` (which keeps the decode layout for further calls).

  Args:
    model: a DecLLM or RedLLM (RedLLM: the prompt is the encoder input).
    prompts: token ids per row (no BOS, no EOS; 0 is padding and not allowed).
    max_new_tokens: generation limit per row (>= 1).
    eos_id: a row stops at this token (-1: never).
    sampling: greedy (temperature 0, the default) or temperature / top-k / top-p sampling.
    rng: PRNG key, required when sampling (each step folds in its index).
    mesh: run sharded on this (data, fsdp, tensor) mesh with the training rule table.
    max_length: cache slots per row (prompt, BOS for DecLLM, new tokens); longer is an error.
  """
  _check(model.cfg, prompts, max_new_tokens, max_length, sampling, rng)  # Before any copy.
  return Generator(model, mesh)(prompts, max_new_tokens=max_new_tokens, eos_id=eos_id,
                                sampling=sampling, rng=rng, max_length=max_length)
