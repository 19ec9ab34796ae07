"""benchmarks/timing.py, the one way the benchmarks time calls: systems alternate, the order
reversed every other round, and each call is timed on its own."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import timing  # noqa: E402


def test_alternating_reverses_the_order_every_other_round():
  seen = []
  calls = [lambda name=name: seen.append(name) for name in "abc"]
  times = timing.alternating(calls, 3, calls_per_round=2, before=lambda i: seen.append(i))
  assert seen == [0, "a", "a", 1, "b", "b", 2, "c", "c",
                  2, "c", "c", 1, "b", "b", 0, "a", "a",
                  0, "a", "a", 1, "b", "b", 2, "c", "c"]
  assert [len(t) for t in times] == [6, 6, 6] and all(x >= 0 for t in times for x in t)


def test_median_seconds_warms_up_then_times_each_call():
  count = []
  assert timing.median_seconds(lambda: count.append(1), 5, warmup=2) >= 0
  assert len(count) == 7
