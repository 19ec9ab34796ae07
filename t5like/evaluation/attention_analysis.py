"""Attention behaviour per layer and head (docs/paper.md, the rank argument and finding 3):

- the attention maps themselves, recomputed layer by layer with the training path's own pieces
  (``Attention.project_qkv`` + its operations' ``attention_weights``), for self- and
  cross-attention;
- their rank: numerical (float32 SVD tolerance), entropy effective rank, and the exact rank of
  triangular maps (a causal map with a positive diagonal is full rank; the rank argument says a
  bidirectional softmax map with head size well below the length tends to low rank);
- Dong et al. (2021)'s residual ratio ``||res(X)|| / ||X||`` of each layer's output, with
  ``res(X) = X - 1 x^T`` (X minus its mean over tokens) and the composite norm
  ``sqrt(||A||_1 ||A||_inf)``;
- locality: attention mass by query-key distance and the mean attended distance.

Analysis covers the first packed segment of each row, restricted to the *input* region (the
RedLLM encoder, the prefix of a PrefixLM batch) for self-attention maps, so causal,
bidirectional and mixed forward/backward attention are compared on the same tokens.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from t5like.models import masks
from t5like.models.blocks import layer_mask
from t5like.models.decllm import default_positions, self_context
from t5like.models.redllm import Encoded

FLOAT32_EPS = float(np.finfo(np.float32).eps)


@dataclasses.dataclass
class LayerMaps:
  """One attention sub-layer's maps for a batch."""

  stack: str  # "decoder" (DecLLM), "encoder", "decoder_self" or "cross" (RedLLM).
  layer: int  # Index in its stack.
  probs_bhts: np.ndarray  # float32 [batch, heads, queries, keys] attention probabilities.
  hidden_btd: np.ndarray  # [batch, tokens, embed] output of the layer (for Dong's ratio).
  q_valid_bt: np.ndarray  # bool [batch, queries] analysed query tokens.
  k_valid_bs: np.ndarray  # bool [batch, keys] analysed key tokens.


def _layers(stack) -> list[nnx.Module]:
  if hasattr(stack, "runs"):  # A MixedStack (dense and MoE layers): its runs in order.
    return [layer for run in stack.runs for layer in _layers(run)]
  graphdef, params = nnx.split(stack.layers)
  return [nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], params))
          for i in range(stack.num_layers)]


def _self_maps(stack, name, x_btd, ctx, valid_bt, cross=None, cross_valid_bs=None,
               attn="attention", norm="pre_attention_norm") -> tuple[jax.Array, list[LayerMaps]]:
  out = []
  for i, layer in enumerate(_layers(stack)):
    idx = jnp.asarray(i)
    h = getattr(layer, norm)(x_btd)
    q, k, _ = getattr(layer, attn).project_qkv(h, h, ctx.rope_bt, ctx.rope_bt)
    probs = getattr(layer, attn).ops.attention_weights(q, k, layer_mask(ctx, idx))
    cross_maps = None
    if cross is not None:  # RedLLM decoder: cross-attention sees the post-self-attention stream.
      x1 = x_btd + layer.self_attention(h, h, ctx.rope_bt, ctx.rope_bt,
                                        layer_mask(ctx, idx))[0]
      h2 = layer.pre_cross_attention_norm(x1)
      qc, kc, _ = layer.cross_attention.project_qkv(h2, cross.encoded_bsd, ctx.rope_bt,
                                                     cross.enc_rope_bs)
      cross_maps = layer.cross_attention.ops.attention_weights(qc, kc, cross.mask_bhts)
    x_btd, _ = layer(x_btd, ctx, idx, None, cross)
    out.append(LayerMaps(name, i, np.asarray(probs), np.asarray(x_btd), valid_bt, valid_bt))
    if cross_maps is not None:
      out.append(LayerMaps("cross", i, np.asarray(cross_maps), np.asarray(x_btd), valid_bt,
                           cross_valid_bs))
  return x_btd, out


def attention_maps(model, batch: Mapping[str, jax.Array]) -> list[LayerMaps]:
  """Every attention map of ``model`` (DecLLM or RedLLM, no dropout) on one batch (numpy or JAX
  arrays, e.g. the pipeline's ``held_out_batch``), each with the model's own score formula."""
  cfg = model.cfg
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  if cfg.family == "decllm":
    tokens = batch["decoder_input_tokens"]
    seg = batch.get("decoder_segment_ids", jnp.ones_like(tokens))
    pos = batch.get("decoder_positions", default_positions(tokens))
    prefix = batch.get("decoder_causal_attention")
    ctx = self_context(cfg, seg, pos, cfg.decoder_attention,
                       prefix if cfg.decoder_attention == "prefix" else None, materialize=True)
    valid = np.asarray(seg) == 1
    if prefix is not None:  # Compare every attention kind on the same (input) tokens.
      valid &= np.asarray(prefix) > 0
    _, maps = _self_maps(model.decoder, "decoder", model.embedding.embed(tokens), ctx, valid)
    return maps
  enc_tokens, dec_tokens = batch["encoder_input_tokens"], batch["decoder_input_tokens"]
  eseg = batch.get("encoder_segment_ids", (enc_tokens != 0).astype(jnp.int32))
  epos = batch.get("encoder_positions", default_positions(enc_tokens))
  ectx = self_context(cfg, eseg, epos, "bidirectional", materialize=True)
  enc_valid = np.asarray(eseg) == 1
  x, maps = _self_maps(model.encoder, "encoder", model.embedding.embed(enc_tokens), ectx,
                       enc_valid)
  enc = Encoded(model.encoder_norm(x), epos, eseg)
  dseg = batch.get("decoder_segment_ids", jnp.ones_like(dec_tokens))
  dpos = model.decoder_positions(batch, enc)  # Continuous positions, as in training.
  dctx = self_context(cfg, dseg, dpos, "causal", materialize=True)
  cross = model.cross_context(enc, masks.cross_attention_mask(dseg, eseg))
  _, dec_maps = _self_maps(model.decoder, "decoder_self", model.embedding.embed(dec_tokens),
                           dctx, np.asarray(dseg) == 1, cross=cross, cross_valid_bs=enc_valid,
                           attn="self_attention", norm="pre_self_attention_norm")
  return maps + dec_maps


def held_out_batch(cfg, rows: int) -> dict[str, np.ndarray]:
  """The first ``rows`` rows of the run's validation split (unshuffled): the analysed tokens."""
  from t5like.data import pipeline
  it = pipeline.make_iterator(cfg, split="validation", batch_size=rows, shuffle=False,
                              repeat=False)
  try:
    return next(iter(it))
  finally:
    if hasattr(it, "close"):
      it.close()


def numerical_rank(p_ts: np.ndarray) -> tuple[int, np.ndarray]:
  """(rank, singular values / largest) with the usual tolerance max(t, s) * eps32 * sigma_max."""
  sv = np.linalg.svd(np.asarray(p_ts, np.float64), compute_uv=False)
  if sv.size == 0 or sv[0] == 0:
    return 0, sv
  return int(np.sum(sv > sv[0] * max(p_ts.shape) * FLOAT32_EPS)), sv / sv[0]


def effective_rank(p_ts: np.ndarray) -> float:
  """Roy & Vetterli's entropy effective rank exp(H(sigma / sum sigma)): smooth, tolerance-free."""
  sv = np.linalg.svd(np.asarray(p_ts, np.float64), compute_uv=False)
  total = sv.sum()
  if total == 0:
    return 0.0
  w = sv[sv > 0] / total
  return float(np.exp(-(w * np.log(w)).sum()))


def triangular_rank(p_ts: np.ndarray) -> int | None:
  """Exact rank of a square triangular map (its non-zero diagonal entries), else None.

  A causal map (and every map of mixed forward/backward attention) is triangular with a positive
  diagonal, so it is exactly full rank — even where float32 SVD, limited by the map's condition
  number, reports less.
  """
  p = np.asarray(p_ts)
  if p.shape[0] != p.shape[1] or not (np.all(np.triu(p, 1) == 0) or np.all(np.tril(p, -1) == 0)):
    return None
  return int(np.count_nonzero(np.diag(p)))


def composite_norm(a: np.ndarray) -> float:
  """sqrt(||A||_1 ||A||_inf): max column abs-sum times max row abs-sum (Dong et al. 2021)."""
  a = np.abs(np.asarray(a, np.float64))
  return float(np.sqrt(a.sum(axis=0).max() * a.sum(axis=1).max())) if a.size else 0.0


def dong_residual_ratio(x_td: np.ndarray) -> float:
  """``||X - 1 mean(X)^T|| / ||X||`` in the composite norm: 0 = every token the same (rank 1)."""
  x = np.asarray(x_td, np.float64)
  denom = composite_norm(x)
  return composite_norm(x - x.mean(axis=0, keepdims=True)) / denom if denom else 0.0


def distance_profile(p_ts: np.ndarray, buckets: int = 8) -> tuple[float, np.ndarray]:
  """(mean attended distance, mass in distance buckets [0], [1], [2,3], [4,7], ...)."""
  t, s = p_ts.shape
  dist = np.abs(np.arange(t)[:, None] - np.arange(s)[None, :])
  mass = float(p_ts.sum())
  if mass == 0:
    return 0.0, np.zeros(buckets)
  bucket = np.minimum(np.where(dist > 0, np.floor(np.log2(np.maximum(dist, 1))) + 1, 0),
                      buckets - 1).astype(int)
  hist = np.bincount(bucket.ravel(), weights=p_ts.ravel(), minlength=buckets)[:buckets]
  return float((p_ts * dist).sum() / mass), hist / mass


def summarize(maps: list[LayerMaps]) -> list[dict[str, Any]]:
  """Per (stack, layer): mean normalised rank over rows and heads, per-head ranks, Dong's ratio,
  mean attended distance and mass by distance bucket."""
  rows = []
  for m in maps:
    b, h = m.probs_bhts.shape[:2]
    ranks = np.zeros((b, h))
    eff = np.zeros((b, h))
    tri = []
    dist = np.zeros((b, h))
    hist = np.zeros((b, h, 8))
    dong = []
    used = []
    for r in range(b):
      qi, ki = np.nonzero(m.q_valid_bt[r])[0], np.nonzero(m.k_valid_bs[r])[0]
      if len(qi) < 2 or len(ki) < 2:
        continue
      used.append(r)
      n = min(len(qi), len(ki))
      for hh in range(h):
        p = m.probs_bhts[r, hh][np.ix_(qi, ki)]
        ranks[r, hh] = numerical_rank(p)[0] / n
        eff[r, hh] = effective_rank(p) / n
        tri.append(triangular_rank(p) == n if m.stack != "cross" else False)
        dist[r, hh], hist[r, hh] = distance_profile(p)
      dong.append(dong_residual_ratio(m.hidden_btd[r][qi]))
    if not used:
      continue
    rows.append({"stack": m.stack, "layer": m.layer,
                 "normalized_rank": float(ranks[used].mean()),
                 "normalized_rank_per_head": ranks[used].mean(axis=0).tolist(),
                 "normalized_rank_per_row": ranks[used].mean(axis=1).tolist(),
                 "normalized_effective_rank": float(eff[used].mean()),
                 "normalized_effective_rank_per_row": eff[used].mean(axis=1).tolist(),
                 "triangular_full_rank_fraction": float(np.mean(tri)) if tri else 0.0,
                 "dong_ratio": float(np.mean(dong)),
                 "mean_distance": float(dist[used].mean()),
                 "mass_by_distance": hist[used].mean(axis=(0, 1)).tolist()})
  return rows


def panels(maps: list[LayerMaps], max_rows: int = 6) -> list[LayerMaps]:
  """The sub-layers worth a row of heatmaps: the first and last layer of each stack (DecLLM:
  its decoder; RedLLM: encoder, decoder self- and cross-attention), in the model's order."""
  stacks = list(dict.fromkeys(m.stack for m in maps))
  picked = []
  for s in stacks:
    of = [m for m in maps if m.stack == s]
    picked += [of[0]] + ([of[-1]] if len(of) > 1 else [])
  picked.sort(key=lambda m: (stacks.index(m.stack), m.layer))
  return picked[:max_rows]


def plot_heads(maps: list[LayerMaps], output_path, *, row: int = 0, max_heads: int = 4,
               title: str = "") -> None:
  """A grid of heatmaps (one row per sub-layer, one column per head) of batch row ``row``:
  queries down, keys across (the analysed tokens), one colour bar of attention probability."""
  from t5like.evaluation.plots import figure_grid, save
  heads = min(max_heads, maps[0].probs_bhts.shape[1])
  fig, axes = figure_grid(len(maps), heads)
  shown = [m.probs_bhts[row, :heads][:, np.nonzero(m.q_valid_bt[row])[0]][
      :, :, np.nonzero(m.k_valid_bs[row])[0]] for m in maps]
  top = max((float(p.max()) for p in shown if p.size), default=1.0) or 1.0
  image = None
  for i, (m, p) in enumerate(zip(maps, shown)):
    for j in range(heads):
      ax = axes[i, j]
      image = ax.imshow(p[j], cmap="viridis", aspect="auto", vmin=0.0, vmax=top)
      ax.set_title(f"{m.stack} L{m.layer} H{j}", fontsize=7)
      ax.set_xticks([])
      ax.set_yticks([])
    axes[i, 0].set_ylabel("query", fontsize=7)
  for ax in axes[-1]:
    ax.set_xlabel("key", fontsize=7)
  if title:
    fig.suptitle(title, fontsize=9)
  fig.tight_layout(rect=(0.0, 0.0, 0.9, 1.0))  # The right tenth: the colour bar.
  fig.colorbar(image, cax=fig.add_axes((0.92, 0.1, 0.015, 0.8)), label="attention probability")
  save(fig, output_path, tight=False)
