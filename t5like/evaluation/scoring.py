"""Rank classification: the log-likelihood of each option given its context, for both families.

- DecLLM: one row ``[0] + context + option`` (seqio's shifted decoder input); the option's tokens
  are scored after the context, with causal attention or, for ``decoder_attention="prefix"``,
  bidirectional attention over the context (``decoder_causal_attention`` set on the BOS, the
  context, as in training's PrefixLM features).
- RedLLM: the context goes to the encoder, the option is scored by the decoder, whose positions
  continue after the encoder length (the model's default for unpacked rows) — continuous
  positions exactly as in training.

Rows are right-padded to lengths rounded up to ``PAD_MULTIPLE`` (few compilations) and scored in
batches by one jitted forward (MoE layers dropless); ``decllm_rows`` / ``redllm_rows`` build them,
here and for lm-evaluation-harness (``harness.py``). Contexts longer than ``max_context`` are cut from the left (the
start of a few-shot prompt goes first) and counted, or rejected with ``on_long="error"``.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from t5like.models.moe import route_dropless

log = logging.getLogger(__name__)
PAD_MULTIPLE = 32
BOS_ID = 0  # seqio's shifted decoder input starts with 0.


@dataclasses.dataclass
class Truncation:
  """How many contexts were cut to fit, over a scoring call."""

  max_context: int  # Longest context kept (tokens).
  truncated: int = 0  # Contexts cut from the left.


class ContextTooLong(ValueError):
  """A context longer than ``max_context`` with ``on_long="error"``."""


def _round_up(n: int) -> int:
  return max(PAD_MULTIPLE, -(-n // PAD_MULTIPLE) * PAD_MULTIPLE)


@nnx.jit
def _logprobs(model, batch):
  """log p of each row's next token at every position: [batch, length] (targets given)."""
  logits = model({k: v for k, v in batch.items() if k != "targets"})
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1)[..., 0]


def fit_context(ctx: list[int], trunc: Truncation, on_long: str) -> list[int]:
  if len(ctx) <= trunc.max_context:
    return ctx
  if on_long == "error":
    raise ContextTooLong(f"context of {len(ctx)} tokens is longer than the model's "
                         f"{trunc.max_context} (pass --on_long=truncate to cut it from the left)")
  trunc.truncated += 1
  return ctx[len(ctx) - trunc.max_context:]


def decllm_rows(pairs: Sequence[tuple[list[int], list[int]]], prefix: bool):
  """DecLLM rows of (context, continuation) pairs whose context starts with the row's first
  token (the BOS, or a rolling window's first token): ``(context + continuation)[:-1]`` predicting
  ``[1:]``, bidirectional over the context for a ``prefix`` model (``decoder_causal_attention``);
  spans of the continuation's positions."""
  length = _round_up(max(len(c) + len(o) - 1 for c, o in pairs))
  rows = {k: np.zeros((len(pairs), length), np.int32) for k in
          ("decoder_input_tokens", "decoder_segment_ids", "targets")}
  if prefix:
    rows["decoder_causal_attention"] = np.zeros((len(pairs), length), np.int32)
  spans = []
  for r, (c, o) in enumerate(pairs):
    seq = c + o
    n = len(seq) - 1
    rows["decoder_input_tokens"][r, :n] = seq[:-1]
    rows["targets"][r, :n] = seq[1:]
    rows["decoder_segment_ids"][r, :n] = 1
    if prefix:
      rows["decoder_causal_attention"][r, :len(c)] = 1
    spans.append((len(c) - 1, n))
  return rows, spans


def redllm_rows(pairs: Sequence[tuple[list[int], list[int]]]):
  """RedLLM rows: the context in the encoder, ``[BOS] + continuation[:-1]`` in the decoder
  predicting the continuation; spans of the continuation's positions."""
  enc_len = _round_up(max(len(c) for c, _ in pairs))
  dec_len = _round_up(max(len(o) for _, o in pairs))
  rows = {"encoder_input_tokens": np.zeros((len(pairs), enc_len), np.int32),
          "decoder_input_tokens": np.zeros((len(pairs), dec_len), np.int32),
          "decoder_segment_ids": np.zeros((len(pairs), dec_len), np.int32),
          "targets": np.zeros((len(pairs), dec_len), np.int32)}
  for r, (c, o) in enumerate(pairs):
    rows["encoder_input_tokens"][r, :len(c)] = c
    rows["decoder_input_tokens"][r, :len(o)] = [BOS_ID] + o[:-1]
    rows["targets"][r, :len(o)] = o
    rows["decoder_segment_ids"][r, :len(o)] = 1
  return rows, [(0, len(o)) for _, o in pairs]


def option_loglikelihoods(model, pairs: Sequence[tuple[list[int], list[int]]], *,
                          batch_size: int = 16) -> list[float]:
  """Sum of log p(option tokens | context) for each (context ids, option ids) pair.

  Contexts must be non-empty for RedLLM (the encoder input) and options non-empty for both.
  MoE layers route dropless (``moe.route_dropless``): an option's score never depends on which
  other rows share its batch.
  """
  model = route_dropless(model)
  out: list[float] = []
  for i in range(0, len(pairs), batch_size):
    chunk = list(pairs[i:i + batch_size])
    if any(not o for _, o in chunk):
      raise ValueError("an option encodes to no tokens; it cannot be scored")
    if model.cfg.family == "redllm":
      rows, spans = redllm_rows(chunk)
    else:  # The row starts with the BOS, the context's first token here.
      rows, spans = decllm_rows([([BOS_ID] + c, o) for c, o in chunk],
                                model.cfg.decoder_attention == "prefix")
    lp = np.asarray(_logprobs(model, {k: jnp.asarray(v) for k, v in rows.items()}),
                    np.float64)
    out += [float(lp[r, a:b].sum()) for r, (a, b) in enumerate(spans)]
  return out
