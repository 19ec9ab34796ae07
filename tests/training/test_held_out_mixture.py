"""The trainer's held-out loss of a mixture: the rate-weighted average of every part's loss,
with each part's loss logged as eval/<part>/loss (issue: it used to be the first part's)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from t5like.data import held_out as data_held_out
from t5like.training import held_out, loop
from t5like.training.data import SyntheticData
from train_helpers import tiny_config

RATES = {"alpha": 0.5, "bravo": 0.3, "charlie": 0.2}
TOKENS = {"alpha": 5, "bravo": 60, "charlie": 117}  # One constant token per part.


def _constant_batch(token: int, rows: int, length: int) -> dict[str, np.ndarray]:
  tgt = np.full((rows, length), token, np.int32)
  inp = np.concatenate([np.zeros((rows, 1), np.int32), tgt[:, :-1]], axis=1)
  ones = np.ones((rows, length), np.int32)
  return {"decoder_input_tokens": inp, "decoder_target_tokens": tgt,
          "decoder_loss_weights": ones, "decoder_segment_ids": ones,
          "decoder_positions": np.broadcast_to(np.arange(length, dtype=np.int32),
                                               (rows, length)).copy()}


class ThreePartData(SyntheticData):
  """Synthetic training data; a held-out mixture of three parts of constant tokens."""

  opened: list[str] = []

  def eval_parts(self, batch_size, shard_index, num_shards, max_batches):
    batches = data_held_out.part_batches(
        [data_held_out.Part(n, r, ()) for n, r in RATES.items()], max_batches)

    def opener(name, n):
      def open_iterator():
        self.opened.append(name)
        return iter([_constant_batch(TOKENS[name], batch_size, self.cfg.data.sequence_length)
                     for _ in range(n)])
      return open_iterator
    return [(name, RATES[name], opener(name, n), n) for name, n in zip(RATES, batches)]


def test_mixture_eval_loss_is_the_rate_weighted_average_of_its_parts(tmp_path):
  cfg = tiny_config("decllm", steps=2)
  cfg.train.eval_steps = 10  # -> 5, 3 and 2 batches by rate.
  data = ThreePartData(cfg)
  result = loop.run(cfg, str(tmp_path), data=data)
  parts = {n: result[f"eval/{n}/loss"] for n in RATES}
  assert len({round(v, 3) for v in parts.values()}) == 3  # The model tells the parts apart.
  assert result["eval_loss"] == pytest.approx(sum(RATES[n] * parts[n] for n in RATES), rel=1e-6)
  assert abs(result["eval_loss"] - parts["alpha"]) > 1e-3  # Not the first part's.
  assert sorted(data.opened) == sorted(RATES)  # Every part read.
  logged = [json.loads(line) for line in open(result["metrics_file"])]
  assert any("eval/charlie/loss" in rec for rec in logged)


def test_combine_drops_empty_parts_and_passes_one_part_through():
  m = lambda loss: {"eval_loss": loss, "eval_loss_with_z": loss, "eval_accuracy": 0.5,  # noqa
                    "eval_tokens": 10.0, "eval_batches": 1, "eval_perplexity": 0.0}
  out = held_out.combine([("a", 0.25, m(2.0)), ("b", 0.5, {}), ("c", 0.25, m(4.0))])
  assert out["eval_loss"] == pytest.approx(3.0) and "eval/b/loss" not in out
  assert out["eval_tokens"] == 20.0 and out["eval/c/loss"] == 4.0
  assert held_out.combine([("only", 1.0, m(1.5))]) == m(1.5)
  assert data_held_out.allocate(10, [0.5, 0.3, 0.2]) == [5, 3, 2]
  assert data_held_out.allocate(2, [0.9, 0.05, 0.05]) == [1, 1, 1]  # Every part at least once.
  assert data_held_out.allocate(7, [1, 1]) == [4, 3]
