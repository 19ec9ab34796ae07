"""Dropout's random bits (``t5like/ops/hash_bits.py``): a distinct counter per element, bits
that look independent across elements, keys and rows, and the same mask however it is sharded."""
from __future__ import annotations

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5like.ops import hash_bits
from t5like.ops.reference import fold

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_counters_are_distinct_per_element_past_one_word():
  """With a 16-element word, a [5, 3, 7] array indexes its rows by ``high`` and the last axis
  by ``low`` (3 x 7 > 16): every element still gets its own (high, low) pair."""
  high, low = hash_bits.counters((5, 3, 7), limit=16)
  pairs = {(int(h), int(l)) for h, l in zip(np.ravel(high), np.ravel(low))}
  assert len(pairs) == 5 * 3 * 7
  assert int(np.max(low)) == 6 and int(np.max(high)) == 14
  high, low = hash_bits.counters((5, 3, 7))  # One word holds all: low is the flat index.
  np.testing.assert_array_equal(np.ravel(low), np.arange(105))
  assert not np.any(high)
  with pytest.raises(ValueError, match="more than 16 elements"):
    hash_bits.counters((17, 2), limit=16)  # The leading axis alone overflows a word.


def _bit_agreement(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """Per bit position, the fraction of elements where ``a`` and ``b`` have the same bit."""
  same = ~(a ^ b)
  return np.array([((same >> j) & 1).mean() for j in range(32)])


def test_bits_look_independent_across_elements_keys_and_rows():
  """Each of the 32 bits is 1 half the time and agrees half the time between neighbours,
  between two sites' keys (``fold`` as the model derives them), and between rows (the high
  counter word): within 6 sigma of a fair coin for every bit position."""
  key = jax.random.key(7)
  shape = (4, 8, 64, 128)
  n = np.prod(shape)
  a = np.asarray(hash_bits.uniform_bits(fold(key, 0), shape))
  b = np.asarray(hash_bits.uniform_bits(fold(key, 1), shape))
  tol = 6 * 0.5 / np.sqrt(n // 4)
  ones = np.array([((a >> j) & 1).mean() for j in range(32)])
  assert np.all(np.abs(ones - 0.5) < tol), ones
  for x, y in [(a[..., 1:], a[..., :-1]), (a, b), (a[1:], a[:-1]), (a[:, 1:], a[:, :-1])]:
    agree = _bit_agreement(x, y)
    assert np.all(np.abs(agree - 0.5) < tol), agree
  np.testing.assert_array_equal(np.asarray(hash_bits.uniform_bits(fold(key, 0), shape)), a)


@pytest.mark.parametrize("rate", [0.05, 0.3, 0.9])
def test_dropout_keeps_the_rate_and_the_expectation(rate):
  """Each element is kept with probability 1 - rate (to 2^-32) and the kept ones are scaled by
  1/q, so the mean of the output is the input's; two sites' masks are independent."""
  from t5like.models.layers import dropout
  x = jnp.full((400, 1000), 2.0, jnp.float32)
  y = np.asarray(dropout(x, rate, jax.random.key(3)))
  kept = y != 0
  q = round(2 ** 32 * (1 - rate)) / 2 ** 32
  n = x.size
  assert abs(kept.mean() - (1 - rate)) < 5 * np.sqrt(rate * (1 - rate) / n)  # 5 sigma.
  np.testing.assert_allclose(y[kept], 2.0 / q, rtol=1e-6)
  assert abs(y.mean() - 2.0) < 5 * 2.0 / q * np.sqrt(q * (1 - q) / n)
  both = (np.asarray(dropout(x, rate, jax.random.key(4))) != 0) & kept
  assert abs(both.mean() - q * q) < 5 * np.sqrt(q * q * (1 - q * q) / n)
  np.testing.assert_array_equal(np.asarray(dropout(x, rate, jax.random.key(3))), y)
  np.testing.assert_array_equal(np.asarray(dropout(x, rate, None)), np.asarray(x))
  np.testing.assert_array_equal(np.asarray(dropout(x, 0.0, jax.random.key(3))), np.asarray(x))


SHARDED_SCRIPT = """
import json
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from t5like.models.layers import dropout
mesh = jax.make_mesh((4, 2), ("a", "b"))
x = jax.numpy.ones((8, 6, 16, 32))
key = jax.random.key(5)
whole = np.asarray(jax.jit(lambda x: dropout(x, 0.3, key))(x))
out = {}
for spec in (P("a", None, "b"), P(None, "b", None, "a"), P(("a", "b"))):
  s = NamedSharding(mesh, spec)
  got = jax.jit(lambda x: dropout(x, 0.3, key), in_shardings=s, out_shardings=s)(x)
  out[str(spec)] = bool(np.array_equal(np.asarray(got), whole))
print("RESULT" + json.dumps(out))
"""


def test_the_mask_does_not_depend_on_the_sharding():
  """8 fake devices: the mask of a sharded dropout is the unsharded one, whichever axes."""
  sys.path.insert(0, os.path.join(REPO, "tests", "training"))
  from train_helpers import run_script
  result = json.loads(run_script(SHARDED_SCRIPT, devices=8).stdout.split("RESULT", 1)[1])
  assert result and all(result.values()), result
