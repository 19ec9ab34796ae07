"""benchmarks/product_floor.py lists every matrix product of a train step: its FLOPs are the
model's (docs/flops.md) less the attention core's, which runs in its own kernel."""
from __future__ import annotations

import sys

import pytest

from t5like.config import ModelConfig
from t5like.training import flops
from train_helpers import REPO


@pytest.fixture(scope="module")
def product_floor():
  path = list(sys.path)  # The benchmark adds the checkout to sys.path at import.
  sys.path.insert(0, REPO)
  try:
    from benchmarks import product_floor
  finally:
    sys.path[:] = path
  return product_floor


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_the_listed_products_are_all_of_the_steps_matmul_flops(product_floor, family):
  # Widths and lengths all differ (heads x head_dim != d_model, grouped KV heads, encoder !=
  # decoder length): a product listed with a wrong length, width or count changes the sum.
  m = ModelConfig(family=family, vocab_size=320, d_model=48, num_heads=4, num_kv_heads=2,
                  head_dim=16, d_ff=80, num_layers=3, num_encoder_layers=2,
                  num_decoder_layers=3)
  batch, dec, enc = 3, 24, (40 if family == "redllm" else 0)
  products = product_floor.step_products(m, batch, dec, enc)
  attention_core = (flops._attn_flops(m, batch, dec, dec, True)
                    * (m.num_decoder_layers if family == "redllm" else m.num_layers))
  if family == "redllm":
    attention_core += (m.num_encoder_layers * flops._attn_flops(m, batch, enc, enc, False)
                       + m.num_decoder_layers * flops._attn_flops(m, batch, dec, enc, False))
  expected = flops.train_flops(m, batch, dec, enc) - 3 * attention_core
  assert sum(p.flops * p.count for p in products) == pytest.approx(expected, rel=1e-12)
  assert len({(p.form, p.m, p.k, p.n) for p in products}) == len(products)  # Shapes merged.
  assert {p.form for p in products} == {"nn", "nt", "tn"}
