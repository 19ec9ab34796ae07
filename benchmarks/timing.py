"""How every benchmark times a call, and the flags they all spell alike.

A timed function must block until its results exist (``jax.block_until_ready``,
``torch.cuda.synchronize``): asynchronous dispatch would otherwise time the launch alone.
On a shared host the same call moves 10-30 % between minutes (docs/performance.md), so systems
compared are timed in alternating rounds (``alternating``), and a row is a median.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Sequence


def seconds(fn: Callable[[], object]) -> float:
  """Wall-clock seconds of one call of ``fn``."""
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def median_seconds(fn: Callable[[], object], repeats: int, *, warmup: int = 1) -> float:
  """Median of ``repeats`` timed calls after ``warmup`` untimed ones (compilation, caches)."""
  for _ in range(warmup):
    fn()
  return statistics.median(seconds(fn) for _ in range(max(repeats, 1)))


def alternating(calls: Sequence[Callable[[], object]], rounds: int, *, calls_per_round: int = 1,
                before: Callable[[int], object] | None = None) -> list[list[float]]:
  """Times of each call over ``rounds`` rounds of ``calls_per_round`` timed calls each, the order
  reversed every other round, so every system sees the same stretch of the host; ``before(i)``
  runs untimed before call ``i``'s turn (a pause, warm-up steps)."""
  times: list[list[float]] = [[] for _ in calls]
  for r in range(rounds):
    order = range(len(calls)) if r % 2 == 0 else reversed(range(len(calls)))
    for i in order:
      if before is not None:
        before(i)
      times[i] += [seconds(calls[i]) for _ in range(calls_per_round)]
  return times


def add_dtype_flag(parser: argparse.ArgumentParser, default: str, *, several: bool = False,
                   choices: Sequence[str] | None = None) -> None:
  """``--dtype`` (``several``: a comma-separated list, e.g. float32,bfloat16)."""
  what = "compute dtypes, comma-separated" if several else "compute dtype"
  parser.add_argument("--dtype", default=default, choices=None if several else choices,
                      help=f"{what} (default {default})")


def add_repeats_flag(parser: argparse.ArgumentParser, default: int, what: str = "timed calls",
                     ) -> None:
  """``--repeats``: how many times a measurement is repeated (its median is reported)."""
  parser.add_argument("--repeats", type=int, default=default,
                      help=f"{what}; the median is reported (default {default})")
