"""The capacity path of the MoE feed-forward: fixed-size expert buffers, expert parallelism.

Each expert takes at most C = ceil(capacity_factor * T * K / N_r) (token, expert) pairs of the
T tokens of one batch shard; pairs claim places in token order (a token's slots in gate order),
pairs beyond C are dropped (their expert output is zero; the shared experts and the residual
still carry the token) and counted. Padding tokens claim no place and are never counted.

Buffers are [experts, C, embed]. With an ``expert`` mesh axis of size P (the rule table maps the
logical ``expert`` axis to it), each device holds N_r / P experts: inside ``shard_map`` every
device fills the buffers of all experts from its own tokens, one ``all_to_all`` over ``expert``
sends each expert's buffer to the device that holds it, the experts run, and a second
``all_to_all`` brings the outputs back. Rows move by gathers both ways: each slot knows its
(token, k) pair (a binary search of the experts' running counts) and each pair its slot, so
neither direction's gradient is a scatter. (``ragged_all_to_all``, which dropless dispatch would
need, does not run on XLA:CPU; this path does, so it is tested on fake CPU devices.)
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax.sharding import PartitionSpec as P

EXPERT_AXIS = "expert"  # Logical axis of the experts (mapped to a mesh axis by the rule table).


def capacity(tokens: int, top_k: int, num_experts: int, factor: float) -> int:
  return max(1, math.ceil(factor * tokens * top_k / num_experts))


def running_count(chosen_ne: jax.Array, block: int = 256) -> jax.Array:
  """``cumsum(chosen, axis=0)`` of a 0/1 int32 [N, E] array, as triangular products over blocks
  of ``block`` rows and over the blocks: XLA:TPU compiles a cumsum over N = T * K rows as a
  reduce-window kernel of ~300k LLO instructions. Exact: 0/1 and block counts <= 256 are exact
  in bfloat16, the sums (< 2^24) in the float32 accumulation."""
  n, e = chosen_ne.shape
  nb = -(-n // block)
  x_bie = jnp.pad(chosen_ne, ((0, nb * block - n), (0, 0))).reshape(nb, block, e)
  x_bie = x_bie.astype(jnp.bfloat16)
  # Block as a batch axis of both operands: a remat policy that saves unbatched products (the
  # paper configs' dots_no_batch) leaves this routing arithmetic to be recomputed.
  tril_bij = jnp.broadcast_to(jnp.tri(block, dtype=jnp.bfloat16), (nb, block, block))
  within_bie = jnp.einsum("bij,bje->bie", tril_bij, x_bie, preferred_element_type=jnp.float32)
  before_ab = jnp.tri(nb, k=-1, dtype=jnp.bfloat16)  # Blocks strictly before block a.
  ahead_be = jnp.einsum("ab,be->ae", before_ab, within_bie[:, -1].astype(jnp.bfloat16),
                        preferred_element_type=jnp.float32)
  upto = (within_bie + ahead_be[:, None, :]).reshape(nb * block, e)[:n]
  return upto.astype(jnp.int32)


def places(idx_tk: jax.Array, valid_t: jax.Array, num_experts: int,
           cap: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(place of each pair in its expert's buffer [T, K] int32, kept [T, K] bool, the pair
  t * K + k in each buffer slot [E, C] int32, T * K where the slot stays empty)."""
  t, k = idx_tk.shape
  chosen_ne = jax.nn.one_hot(idx_tk.reshape(-1), num_experts, dtype=jnp.int32)
  chosen_ne = chosen_ne * jnp.repeat(valid_t.astype(jnp.int32), k)[:, None]
  upto_ne = running_count(chosen_ne)  # Pairs of that expert up to this one, this included.
  place_tk = jnp.sum((upto_ne - 1) * chosen_ne, axis=-1).reshape(t, k)
  kept_tk = valid_t[:, None] & (place_tk < cap)
  # Slot c of expert e holds the first pair at which that expert's running count reaches c + 1
  # (a binary search per slot: the count never decreases); none reaches it: T * K.
  want_c = jnp.arange(1, cap + 1, dtype=jnp.int32)
  pair_ec = jax.vmap(lambda upto_n: jnp.searchsorted(upto_n, want_c), in_axes=1)(upto_ne)
  return place_tk, kept_tk, pair_ec.astype(jnp.int32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def take(src: jax.Array, index: tuple[jax.Array, ...], inverse: tuple[jax.Array, ...],
         fold_axis: int | None) -> jax.Array:
  """``src[index]`` (one index array per leading axis of ``src``; zero where an index is out of
  range), differentiated by a gather too: ``dy[inverse]``, summed over ``fold_axis`` where
  several outputs took the same row. A custom VJP because the gradient of a gather is a
  scatter-add, which XLA:TPU compiles with a sort of its indices (hundreds of thousands of
  (token, expert) pairs a layer); here the inverse is known. Reverse mode only (no ``jvp``)."""
  return src.at[index].get(mode="fill", fill_value=0)


def _take_fwd(src, index, inverse, fold_axis):
  return take(src, index, inverse, fold_axis), inverse


def _take_bwd(fold_axis, inverse, dy):
  rows = dy.at[inverse].get(mode="fill", fill_value=0)
  if fold_axis is not None:
    rows = jnp.sum(rows, axis=fold_axis, dtype=jnp.float32).astype(dy.dtype)
  return rows, None, None


take.defvjp(_take_fwd, _take_bwd)


def _experts(x_ecd: jax.Array, wi_gate, wi_up, wo) -> jax.Array:
  """Every expert's SwiGLU on its buffer: [..., E, C, d] with weights [E, d, f] / [E, f, d]
  (products in x's dtype, as ``ops.dense``)."""
  gate = jnp.einsum("...ecd,edf->...ecf", x_ecd, wi_gate)
  up = jnp.einsum("...ecd,edf->...ecf", x_ecd, wi_up)
  return jnp.einsum("...ecf,efd->...ecd", jax.nn.silu(gate) * up, wo)


def _local(x_td, idx_tk, valid_t, weights, factor: float, axis: str | None, shards: int):
  """One batch shard: fill buffers, (exchange,) run the experts, (exchange back,) gather."""
  wi_gate = weights[0]
  e = wi_gate.shape[0] * shards
  t, k = idx_tk.shape
  cap = capacity(t, k, e, factor)
  place_tk, kept_tk, pair_ec = places(idx_tk, valid_t, e, cap)
  place_tk = jnp.where(kept_tk, place_tk, cap)  # Out of range: a dropped pair takes no slot.
  token_ec, k_ec = pair_ec // k, pair_ec % k  # Each slot's pair; empty slots: token T (none).
  buf_ecd = take(x_td, (token_ec,), (idx_tk, place_tk), 1)
  if axis is None:
    out_ecd = _experts(buf_ecd, *weights)
  else:  # [P, E/P, C, d]: chunk p goes to device p; received chunks are indexed by source.
    buf = jax.lax.all_to_all(buf_ecd.reshape(shards, e // shards, cap, -1), axis, 0, 0)
    out = jax.lax.all_to_all(_experts(buf, *weights), axis, 0, 0)
    out_ecd = out.reshape(e, cap, -1)
  y_tkd = take(out_ecd, (idx_tk, place_tk), (token_ec, k_ec), None)
  return y_tkd, kept_tk


def capacity_experts(x_btd: jax.Array, idx_btk: jax.Array, valid_bt: jax.Array,
                     weights: tuple[jax.Array, jax.Array, jax.Array],
                     factor: float) -> tuple[jax.Array, jax.Array]:
  """(expert outputs [b, t, K, d] (zero where dropped), kept [b, t, K]) with capacity per
  batch shard of the current mesh; experts split over the mesh axis of logical ``expert``."""
  b, t, d = x_btd.shape
  k = idx_btk.shape[-1]

  def run(x, idx, valid, wg, wu, wo, axis=None, shards=1):
    bl = x.shape[0]
    y, kept = _local(x.reshape(bl * t, d), idx.reshape(bl * t, k), valid.reshape(bl * t),
                     (wg, wu, wo), factor, axis, shards)
    return y.reshape(bl, t, k, d), kept.reshape(bl, t, k)

  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return run(x_btd, idx_btk, valid_bt, *weights)
  batch = nn.logical_to_mesh_axes(("batch",))[0]
  axis = nn.logical_to_mesh_axes((EXPERT_AXIS,))[0]
  shards = mesh.shape[axis] if axis is not None else 1
  rows = P(batch)
  w_spec = P(axis)

  def body(x, idx, valid, wg, wu, wo):
    return run(x, idx, valid, wg, wu, wo, axis if shards > 1 else None, shards)
  return jax.shard_map(body, mesh=mesh, in_specs=(rows, rows, rows, w_spec, w_spec, w_spec),
                       out_specs=(rows, rows), check_vma=False)(
                           x_btd, idx_btk, valid_bt, *weights)
