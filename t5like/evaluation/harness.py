"""lm-evaluation-harness on t5like checkpoints, on the devices at hand: no export, no torch.

``T5LikeLM`` is an ``lm_eval.api.model.LM`` registered as ``t5like`` (``lm_eval --model t5like
--model_args workdir=W[,step=N]``; ``eval.py --harness``). It restores the checkpoint onto a mesh
of every device (pure FSDP, as ``eval.py``), and serves the harness's three request types with
the same token conventions as the exported model under ``lm_eval --model hf`` (float32 on CPU:
equal scores, ``tests/hf/test_harness_vs_export.py``):

- ``loglikelihood``: the context's trailing spaces go to the continuation; DecLLM scores the
  continuation's tokens of ``[BOS] + encode(context + continuation)`` after the context's
  (bidirectionally over ``[BOS] + context`` for a prefix model, which the export route cannot
  flag); RedLLM reads ``encode(context)`` with its encoder and scores ``encode(continuation)``
  with its decoder (continuous positions). ``is_greedy``: every continuation token is the
  argmax. Longer inputs are cut from the left, as the harness's HF model does.
- ``loglikelihood_rolling``: every token of the document scored once. DecLLM: the harness's
  windows (``get_rolling_token_windows`` / ``make_disjoint_window``) of ``max_length`` tokens
  (default ``data.sequence_length``) after the BOS. RedLLM (``rolling=split``, the default): the
  document in decoder blocks of ``max_target_length`` tokens (default ``data.targets_length``),
  each with the ``max_length`` tokens before it (default ``data.inputs_length``) in the encoder,
  the first with EOS alone — the input / target split of training and of ``eval.py``'s ``ppl``
  suite; ``rolling=harness`` uses the harness's windows instead (encoder: the one token before
  each window), as the export route does.
- ``generate_until``: t5like's KV-cache ``Generator`` in batches, greedy unless the request
  samples, ``max_gen_toks`` new tokens at most, the text cut at the first stop sequence.

Requests are sorted by length (longest first) and batched; a batch is padded to a multiple of the
mesh's data shards and placed on the mesh. Compute in bfloat16 on accelerators, float32 on CPU
(``dtype=``). Every host gets all requests (the harness's ``rank`` 0 of ``world_size`` 1) and runs
the same batches in lock-step; ``eval.py`` writes the results from process 0 only.
"""
from __future__ import annotations

import contextlib
import json
import logging
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec
import lm_eval.models  # noqa: F401 — lm-eval's own models first: it adds them only to an empty registry.
from lm_eval import utils as lm_utils
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from t5like import partitioning
from t5like.config import ConfigError
from t5like.evaluation.scoring import decllm_rows, redllm_rows

log = logging.getLogger(__name__)
BOS_ID, EOS_ID = 0, 1  # BOS: scoring.BOS_ID, seqio's decoder start.


@nnx.jit
def _token_scores(model, batch):
  """(log p of each target, whether it is the argmax): [batch, length] each, replicated."""
  logits = model({k: v for k, v in batch.items() if k != "targets"}).astype(jnp.float32)
  logp = jax.nn.log_softmax(logits, axis=-1)
  lp = jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1)[..., 0]
  greedy = jnp.argmax(logits, axis=-1) == batch["targets"]
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty:  # Every host reads every row.
    lp = jax.lax.with_sharding_constraint(lp, PartitionSpec())
    greedy = jax.lax.with_sharding_constraint(greedy, PartitionSpec())
  return lp, greedy


def _int(value, name: str, default: int | None = None) -> int | None:
  if value is None or value == "":
    return default
  try:
    return int(value)
  except (TypeError, ValueError):
    raise ConfigError(f"t5like model argument {name}={value!r}: give an integer") from None


def _grouped(keys: Sequence[Any], batch: int):
  """Indices sorted by key (largest first), in chunks of ``batch``."""
  order = sorted(range(len(keys)), key=lambda i: keys[i], reverse=True)
  return [order[i:i + batch] for i in range(0, len(order), batch)]


@register_model("t5like")
class T5LikeLM(LM):
  """A t5like checkpoint for lm-evaluation-harness (see the module docstring).

  Args (``--model_args``, all strings from the command line):
    workdir: a train.py workdir, checkpoints dir or step dir (any URI, e.g. ``gs://``).
    step: the checkpoint step (default: the newest).
    batch_size: rows per batch (``auto``: 16).
    max_length: DecLLM: the longest row (default ``data.sequence_length``); RedLLM: the longest
      encoder input (default ``data.inputs_length``) — and, given explicitly, the longest decoder
      row too (one length, as the harness's HF model has).
    max_target_length: RedLLM's longest decoder row (default ``data.targets_length``).
    max_gen_toks: new tokens per generation unless the task says (default 256).
    dtype: compute dtype (default ``auto``: bfloat16 on accelerators, float32 on CPU).
    rolling: perplexity windows, ``split`` (default) or ``harness`` (the export route's: RedLLM's
      encoder reads one token per window; DecLLM's document starts with a BOS that is scored).
    seed: PRNG seed of sampled generations.
  """

  def __init__(self, workdir: str = "", step=None, batch_size=16, max_length=None,
               max_target_length=None, max_gen_toks=256, dtype: str = "auto",
               rolling: str = "split", seed=0, **unused):
    super().__init__()
    if not workdir:
      raise ConfigError("the t5like model needs --model_args workdir=W[,step=N] (a train.py "
                        "workdir)")
    if rolling not in ("split", "harness"):
      raise ConfigError(f"t5like model argument rolling={rolling!r}: choose split or harness")
    for name in sorted(unused):
      if unused[name] not in (None, "", "cpu", "cuda") and name not in ("device", "max_batch_size"):
        log.warning("t5like model: argument %s=%r is not used", name, unused[name])
    from t5like.data.vocab import get_vocabulary
    from t5like.inference.checkpoint import load_model
    if dtype == "auto":
      dtype = "float32" if jax.default_backend() == "cpu" else "bfloat16"
    self.model, self.cfg, self.step_dir = load_model(
        workdir, step=_int(step, "step"), overrides=[f"model.dtype={dtype}"])
    self.mesh = partitioning.make_mesh(self.cfg.mesh)
    self.vocab = get_vocabulary(self.cfg.data.vocab_path)
    self.family = self.cfg.model.family
    self.batch_size = 16 if str(batch_size).startswith("auto") else _int(batch_size, "batch_size")
    data = self.cfg.data
    self.encdec = self.family == "redllm"
    default_len = data.inputs_length if self.encdec else data.sequence_length
    self.max_length = _int(max_length, "max_length", default_len)
    self.max_target_length = _int(max_target_length, "max_target_length",
                                  self.max_length if max_length not in (None, "")
                                  else data.targets_length)
    self.max_gen_toks = _int(max_gen_toks, "max_gen_toks")
    self.rolling = rolling
    self.seed = _int(seed, "seed")
    self._generator = None

  # Tokens, as the exported tokenizer gives them: DecLLM puts its BOS (0) in front.
  def tok_encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
    ids = list(self.vocab.encode(text))
    return [BOS_ID] + ids if add_special_tokens and not self.encdec else ids

  def tok_decode(self, ids: Sequence[int]) -> str:
    return self.vocab.decode([int(t) for t in ids if t > EOS_ID])

  @property
  def prefix_token_id(self) -> int:
    """The context of an empty context and of the first rolling window: DecLLM's BOS, RedLLM's
    EOS (its tokenizer has no BOS), as the harness's HF model takes them."""
    return EOS_ID if self.encdec else BOS_ID

  def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """The harness's split: trailing spaces of the context start the continuation; DecLLM's
    continuation is the whole text's tokens after the context's, RedLLM's is encoded alone."""
    if context == "":
      return [self.prefix_token_id], self.tok_encode(continuation, add_special_tokens=False)
    n = len(context) - len(context.rstrip())
    if n:
      context, continuation = context[:-n], context[-n:] + continuation
    ctx = self.tok_encode(context)
    if self.encdec:
      return ctx, self.tok_encode(continuation, add_special_tokens=False)
    return ctx, self.tok_encode(context + continuation)[len(ctx):]

  # Scoring.
  def _on_mesh(self):
    return contextlib.ExitStack() if self.mesh is None else _mesh_context(self.mesh)

  def _place(self, array: np.ndarray) -> jax.Array:
    """A host array (the same on every host) as a global array, rows over the data shards."""
    sharding = partitioning.batch_sharding(self.mesh)
    if array.ndim == 1:
      sharding = NamedSharding(self.mesh, PartitionSpec(sharding.spec[0]))
    return jax.make_array_from_callback(array.shape, sharding, lambda idx: array[idx])

  def _score_batch(self, pairs) -> list[tuple[float, bool]]:
    if self.encdec:
      rows, spans = redllm_rows(pairs)
    else:
      rows, spans = decllm_rows(pairs, self.cfg.model.decoder_attention == "prefix")
    shards = partitioning.data_shards(self.mesh)
    fill = -len(pairs) % shards  # Filler rows (copies of row 0) for the mesh, dropped after.
    rows = {k: np.concatenate([v, np.repeat(v[:1], fill, 0)]) for k, v in rows.items()}
    with self._on_mesh():
      lp, greedy = _token_scores(self.model, {k: self._place(v) for k, v in rows.items()})
    lp, greedy = np.asarray(lp, np.float64), np.asarray(greedy)
    return [(float(lp[r, a:b].sum()), bool(greedy[r, a:b].all()))
            for r, (a, b) in enumerate(spans)]

  def _fit(self, ctx: list[int], cont: list[int]) -> tuple[list[int], list[int]]:
    """Cut from the left to the model's lengths, as the harness's HF model does."""
    if not cont:
      raise ValueError("a continuation encodes to no tokens; it cannot be scored")
    if self.encdec:
      return ctx[-self.max_length:] or [self.prefix_token_id], cont[-self.max_target_length:]
    cont = cont[-self.max_length:]
    seq = (ctx + cont)[-(self.max_length + 1):]
    return seq[:len(seq) - len(cont)], cont

  def score_tokens(self, pairs: Sequence[tuple[list[int], list[int]]]
                   ) -> list[tuple[float, bool]]:
    """(log-likelihood, is_greedy) of each (context ids, continuation ids) pair, in batches of
    similar lengths, longest first."""
    pairs = [self._fit(list(c), list(o)) for c, o in pairs]
    out: list[Any] = [None] * len(pairs)
    keys = [(len(c) + len(o), len(o)) for c, o in pairs]
    for chunk in _grouped(keys, self.batch_size):
      for i, res in zip(chunk, self._score_batch([pairs[i] for i in chunk])):
        out[i] = res
    return out

  def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
    del disable_tqdm
    out = self.score_tokens([self._encode_pair(*req.args) for req in requests])
    for req, res in zip(requests, out):
      self.cache_hook.add_partial("loglikelihood", req.args, res)
    return out

  def rolling_windows(self, text: str) -> list[tuple[list[int], list[int]]]:
    """(context, continuation) pairs that score every token of ``text`` once."""
    # rolling=harness: the tokens the harness's HF model rolls over, DecLLM's BOS among them
    # (scored after the prefix token, as there); split: the text's own tokens.
    tokens = self.tok_encode(text, add_special_tokens=self.rolling == "harness")
    if self.encdec and self.rolling == "split":
      return [(tokens[max(0, i - self.max_length):i] or [self.prefix_token_id],
               tokens[i:i + self.max_target_length])
              for i in range(0, len(tokens), self.max_target_length)]
    return [lm_utils.make_disjoint_window(w) for w in lm_utils.get_rolling_token_windows(
        token_list=tokens, prefix_token=self.prefix_token_id, max_seq_len=self.max_length,
        context_len=1)]

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
    del disable_tqdm
    windows, owner = [], []
    for i, req in enumerate(requests):
      for w in self.rolling_windows(req.args[0]):
        windows.append(w)
        owner.append(i)
    scores = self.score_tokens(windows)  # All documents' windows batched together.
    out = [0.0] * len(requests)
    for i, (ll, _) in zip(owner, scores):
      out[i] += ll
    for req, res in zip(requests, out):
      self.cache_hook.add_partial("loglikelihood_rolling", req.args, res)
    return out

  # Generation.
  def _generate_group(self, contexts: list[str], kwargs: dict) -> list[str]:
    from t5like.inference import Generator, SamplingConfig
    kwargs = dict(kwargs)
    until = kwargs.pop("until", None) or [self.tok_decode([EOS_ID]) or "</s>"]
    until = [until] if isinstance(until, str) else list(until)
    new = int(kwargs.pop("max_gen_toks", self.max_gen_toks))
    temperature = float(kwargs.pop("temperature", 0.0) or 0.0)
    sample = bool(kwargs.pop("do_sample", False)) and temperature > 0
    sampling = SamplingConfig(temperature if sample else 0.0,
                              int(kwargs.pop("top_k", 0) or 0) if sample else 0,
                              float(kwargs.pop("top_p", 1.0) or 1.0) if sample else 1.0)
    if self._generator is None:
      self._generator = Generator(self.model, self.mesh)
    room = self.max_length if self.encdec else self.max_length - new - 1  # DecLLM: + BOS.
    prompts = [self.tok_encode(c, add_special_tokens=False)[-max(room, 1):] for c in contexts]
    if any(not p for p in prompts):
      raise ValueError("a generate_until context encodes to no tokens; t5like generates from a "
                       "non-empty prompt")
    out: list[Any] = [None] * len(prompts)
    rng = jax.random.key(self.seed) if not sampling.greedy else None
    for chunk in _grouped([len(p) for p in prompts], self.batch_size):
      ids = self._generator([prompts[i] for i in chunk], max_new_tokens=new, eos_id=EOS_ID,
                            sampling=sampling, rng=rng,
                            max_length=max(max(len(prompts[i]) for i in chunk) + 1 + new, 16))
      for i, toks in zip(chunk, ids):
        text = self.tok_decode(toks)
        for stop in until:
          if stop:
            text = text.split(stop)[0]
        out[i] = text
    return out

  def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
    del disable_tqdm
    groups: dict[str, list[int]] = {}
    for i, req in enumerate(requests):
      groups.setdefault(json.dumps(req.args[1], sort_keys=True, default=str), []).append(i)
    out: list[Any] = [None] * len(requests)
    for indices in groups.values():
      texts = self._generate_group([requests[i].args[0] for i in indices],
                                   requests[indices[0]].args[1])
      for i, text in zip(indices, texts):
        out[i] = text
        self.cache_hook.add_partial("generate_until", requests[i].args, text)
    return out


@contextlib.contextmanager
def _mesh_context(mesh):
  with jax.set_mesh(mesh), partitioning.axis_rules(mesh):
    yield
