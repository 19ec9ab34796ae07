"""``eval.py --suite experts``: the expert-assignment analysis of an MoE checkpoint (docs/moe.md).

Per MoE layer, over held-out batches of each data subset (the parts of the run's mixture):

- the distribution of the routed (token, expert) pairs over the experts, per subset (a heatmap
  of subsets x experts per layer) and its entropy (nats; log(num_experts) = perfectly even);
- each expert's most preferred tokens: the tokens (seen at least ``min_count`` times) with the
  largest share of their occurrences routed to it;
- for given tokens (``--tokens``), the distribution of their occurrences over the experts.

Only real (non-padding) tokens count. The routed experts are those of the input token at each
position (RedLLM encoder: the encoder inputs; decoders: the decoder inputs).
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import jax
import numpy as np
from etils import epath
from flax import nnx

from t5like.models import moe


@nnx.jit
def _routes(model, batch):
  with moe.collect_stats(routes=True):
    model(batch)
  return {k: v.chosen for k, v in moe.pop_layer_stats(model).items()}


def _inputs(batch: Mapping[str, Any], stack: str) -> tuple[np.ndarray, np.ndarray]:
  """(tokens, real-token mask) the ``stack``'s MoE layers route, as the model decides them."""
  if stack == "encoder":
    tokens = np.asarray(batch["encoder_input_tokens"])
    seg = batch.get("encoder_segment_ids")
    return tokens, (np.asarray(seg) > 0) if seg is not None else tokens != 0
  tokens = np.asarray(batch["decoder_input_tokens"])
  seg = batch.get("decoder_segment_ids")
  if seg is not None:
    return tokens, np.asarray(seg) > 0
  return tokens, np.asarray(batch["decoder_target_tokens"]) > 0


def count_routes(model, batches_by_subset: Mapping[str, Iterable[Mapping[str, Any]]],
                 vocab_size: int) -> tuple[dict, dict]:
  """(counts[layer][subset] [experts], token_counts[layer] [vocab, experts]) of real tokens."""
  names = moe.moe_layer_names(model)
  e = model.cfg.moe.num_experts
  counts: dict[str, dict[str, np.ndarray]] = {n: {} for ns in names.values() for n in ns}
  per_token = {n: np.zeros((vocab_size, e), np.int64) for n in counts}
  for subset, batches in batches_by_subset.items():
    for n in counts:
      counts[n][subset] = np.zeros(e, np.int64)
    for batch in batches:
      chosen = jax.device_get(_routes(model, {k: np.asarray(v) for k, v in batch.items()}))
      for path, chosen_lbtk in chosen.items():
        tokens, valid = _inputs(batch, path[0])
        for name, c_btk in zip(names[path], np.asarray(chosen_lbtk)):
          picked = c_btk[valid]  # [real tokens, K]
          counts[name][subset] += np.bincount(picked.ravel(), minlength=e)
          np.add.at(per_token[name], (np.repeat(tokens[valid], picked.shape[-1]),
                                      picked.ravel()), 1)
  return counts, per_token


def _entropy(p: np.ndarray) -> float:
  p = p[p > 0]
  return float(-(p * np.log(p)).sum())


def summarize(counts: dict, per_token: dict, *, query_tokens: Sequence[int] = (),
              min_count: int = 5, top: int = 8) -> dict[str, Any]:
  """The JSON-ready analysis of ``count_routes``'s counts."""
  out: dict[str, Any] = {}
  for name, by_subset in counts.items():
    total = sum(by_subset.values())
    tok = per_token[name]
    seen = tok.sum(1)
    share = tok / np.maximum(seen, 1)[:, None]
    share[seen < min_count] = -1.0
    out[name] = {
        "distribution": {s: (c / max(c.sum(), 1)).tolist() for s, c in by_subset.items()},
        "pairs": {s: int(c.sum()) for s, c in by_subset.items()},
        "entropy": _entropy(total / max(total.sum(), 1)),
        "max_entropy": float(np.log(len(total))),
        "top_tokens": [[int(t) for t in np.argsort(-share[:, i], kind="stable")[:top]
                        if share[t, i] > 0] for i in range(tok.shape[1])],
        "tokens": {str(t): (tok[t] / max(tok[t].sum(), 1)).tolist() for t in query_tokens},
    }
  return out


def plot(analysis: dict[str, Any], png: str, title: str) -> None:
  """One heatmap per MoE layer: data subsets (rows) x experts (columns), shares of the pairs."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  layers = list(analysis)
  fig, axes = plt.subplots(len(layers), 1, figsize=(8, 1.2 + 0.9 * len(layers) * max(
      1, len(next(iter(analysis.values()))["distribution"])) / 2), squeeze=False)
  for ax, name in zip(axes[:, 0], layers):
    dist = analysis[name]["distribution"]
    im = ax.imshow(np.array(list(dist.values())), aspect="auto", cmap="viridis", vmin=0)
    ax.set_yticks(range(len(dist)), list(dist), fontsize=7)
    ax.set_title(f"{name} (entropy {analysis[name]['entropy']:.2f} / "
                 f"{analysis[name]['max_entropy']:.2f} nats)", fontsize=8)
    fig.colorbar(im, ax=ax)
  axes[-1, 0].set_xlabel("expert")
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  with epath.Path(png).open("wb") as f:
    fig.savefig(f, dpi=110)
  plt.close(fig)


def subset_batches(cfg, rows: int, max_batches: int) -> dict[str, list[dict]]:
  """Each part of the run's held-out mixture (``t5like.data.held_out``: the same fixed rows the
  held-out loss reads): up to ``max_batches`` batches of ``rows`` rows (padding rows all zero)."""
  from t5like.data import held_out
  out = {}
  for part in held_out.parts(cfg):
    it = held_out.sample_iterator_factory(cfg, part, batches=max_batches, global_rows=rows,
                                          batch_size=rows)()
    try:
      out[part.name] = [dict(b) for _, b in zip(range(max_batches), it)]
    finally:
      if hasattr(it, "close"):
        it.close()
  return out
