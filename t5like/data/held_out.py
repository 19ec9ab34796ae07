"""The held-out sample of a task or mixture: fixed rows that cover every part, on any host count.

A mixture's held-out loss is the rate-weighted average of its parts' losses (its direct parts:
RedPajama subsets, FLAN sub-mixtures), each scored on its own fixed sample:

- ``max_batches`` global batches are split across the parts in proportion to their mixing rates
  (largest remainder, at least one batch per part); ``max_batches <= 0`` takes every row;
- inside a part, its rows (``batches x global rows``) are split across its seqio tasks by rate
  (largest remainder, none guaranteed: a FLAN sub-mixture has hundreds), and each task gives the
  first rows of its validation split, read unsharded and unshuffled;
- each host keeps every ``num_shards``-th of those rows (``shard_index``, ``shard_index + n``,
  ...), so the union over hosts is the same set of rows for 1, 2 or 64 hosts, and every eval
  reads the same rows.

Every host reads its parts' samples whole (a few batches each) and keeps its stride: the price
of a sample that does not depend on the host count.
"""
from __future__ import annotations

import dataclasses
import functools

from t5like.data import pipeline


@dataclasses.dataclass(frozen=True)
class Part:
  """One direct part of a held-out mixture."""

  name: str  # Short name (``arxiv``; ``cot`` for a FLAN sub-mixture); the task's for one task.
  rate: float  # Its share of the mixture's rate (the parts' rates sum to 1).
  tasks: tuple[tuple[str, float], ...]  # (seqio task, share of the part's rate) of its tasks.
  full: str = ""  # Its own name as a mixture/task name (``redpajama_v1.arxiv``).


def allocate(total: int, weights: list[float], minimum: int = 1) -> list[int]:
  """``total`` split in proportion to ``weights`` (largest remainder; ties to the earlier), each
  share at least ``minimum`` (so the sum exceeds ``total`` when ``total`` is too small)."""
  s = sum(weights)
  exact = [total * w / s for w in weights]
  shares = [max(minimum, int(x)) for x in exact]
  order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - int(exact[i])), i))
  for i in order[:max(0, total - sum(shares))]:
    shares[i] += 1
  return shares


def parts(cfg, mixture: str | None = None) -> list[Part]:
  """The direct parts of ``mixture`` (default: ``data.eval_mixture`` or ``data.mixture``) with
  their normalized rates; one part for a single task."""
  import seqio  # pylint: disable=g-import-not-at-top

  name = mixture or cfg.data.eval_mixture or cfg.data.mixture
  provider = seqio.get_mixture_or_task(pipeline.resolve_mixture(cfg, name))
  if not isinstance(provider, seqio.Mixture):
    return [Part(name, 1.0, ((provider.name, 1.0),), name)]
  base = name.split(":", 1)[0] + "."
  grouped: dict[str, list[tuple[str, float]]] = {}
  for task in provider.tasks:
    if "validation" not in task.splits:
      continue
    user = task.name.split(":", 1)[0]
    part = user[len(base):].split(".", 1)[0] if user.startswith(base) else user
    grouped.setdefault(part, []).append((task.name, float(provider.get_rate(task))))
  if not grouped:
    raise ValueError(f"no task of {name} has a 'validation' split")
  total = sum(r for tasks in grouped.values() for _, r in tasks)
  out = []
  for part, tasks in grouped.items():
    rate = sum(r for _, r in tasks)
    full = base + part if tasks[0][0].startswith(base) else part
    out.append(Part(part, rate / total, tuple((t, r / rate) for t, r in tasks), full))
  return out


def part_batches(all_parts: list[Part], max_batches: int) -> list[int]:
  """Global batches of each part for an evaluation of ``max_batches`` (<= 0: every row)."""
  if max_batches <= 0:
    return [0] * len(all_parts)
  return allocate(max_batches, [p.rate for p in all_parts])


def sample_iterator_factory(cfg, part: Part, *, batches: int, global_rows: int,
                            batch_size: int, shard_index: int = 0, num_shards: int = 1):
  """A callable giving fresh iterators over this host's rows of ``part``'s fixed sample
  (``batches`` global batches of ``global_rows``; 0: every row), in ``batch_size``-row batches
  padded with all-zero rows. The tf.data pipeline is built once, here."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  if batches > 0:
    weights = [w for _, w in part.tasks]
    rows = allocate(batches * global_rows, weights, minimum=0)  # By rate (FLAN: many tasks).
  else:
    rows = [-1] * len(part.tasks)  # tf.data's take(-1): everything.
  pieces = [pipeline.make_dataset(cfg, split="validation", batch_size=1, shuffle=False,
                                  repeat=False, mixture=task.split(":", 1)[0]
                                  if _is_t5like(task) else task, batched=False).take(n)
            for (task, _), n in zip(part.tasks, rows) if n != 0]
  ds = functools.reduce(lambda a, b: a.concatenate(b), pieces)
  if num_shards > 1:
    ds = ds.enumerate().filter(lambda i, _: i % num_shards == shard_index).map(lambda _, x: x)
  pad = functools.partial(pipeline._pad_rows, batch_size)  # pylint: disable=protected-access
  ds = ds.batch(batch_size).map(pad)
  options = tf.data.Options()
  options.deterministic = True
  ds = ds.prefetch(2).with_options(options)
  kwargs = dict(fingerprint={"held_out_part": part.name}, task_names=[t for t, _ in part.tasks],
                split="validation", shard_index=shard_index, num_shards=num_shards)
  return lambda: pipeline.DataIterator(ds, **kwargs)


def _is_t5like(seqio_name: str) -> bool:
  from t5like.data import tasks  # pylint: disable=g-import-not-at-top
  return bool(tasks.corpus_kind(seqio_name.split(":", 1)[0]))
