"""benchmarks/gpu_train.py and gpu_decode.py (``make bench-gpu``), checked on CPU: the FLOP
counting is ``flops.train_flops`` at the paper's 1B shapes, the packed rows are seqio-packed, the
decode floor counts the bytes a step reads, the trace split sums GPU kernels by class, the docs
row is built from the rows; and ``--smoke`` runs end to end (slow)."""
from __future__ import annotations

import sys

import jax.numpy as jnp
import numpy as np
import pytest

from t5like.config import ModelConfig, paper_model
from t5like.models import masks
from t5like.ops import cudnn_packed
from t5like.training import flops
from t5like.training.data import SyntheticData
from train_helpers import REPO


@pytest.fixture(scope="module")
def bench():
  path = list(sys.path)  # The benchmark adds the checkout to sys.path at import.
  sys.path.insert(0, REPO)
  try:
    from benchmarks import gpu_train
  finally:
    sys.path[:] = path
  return gpu_train


@pytest.mark.parametrize("family, dec, enc", [("decllm", 2048, 0), ("redllm", 1024, 1024)])
def test_mfu_counts_train_flops_of_the_paper_1b_shapes(bench, family, dec, enc):
  cfg = bench.make_config(family, bench.Shape(), "full", 1, packed=False)
  assert (cfg.model.d_model, cfg.model.num_heads, cfg.model.d_ff) == (2048, 16, 8192)
  assert cfg.model.attention_impl == "cudnn" and cfg.model.dtype == "bfloat16"
  assert cfg.model.max_segments_per_row == 1  # Unpacked rows: the plain cuDNN call.
  want = flops.train_flops(paper_model(family, "1b"), 8, dec, enc)
  n = bench.train_numbers(cfg, 0.5, 989e12, dec, enc)
  assert n["flops"] == want
  assert n["mfu"] == pytest.approx(want / 0.5 / 989e12, rel=1e-12)
  assert n["tokens_s"] == 8 * 2048 / 0.5  # Every position of a row, encoder + decoder.
  packed = bench.make_config(family, bench.Shape(layers=4), "dots", 2, packed=True)
  assert packed.model.max_segments_per_row == 0 and packed.data.pack
  assert (packed.model.num_layers if family == "decllm" else packed.model.num_decoder_layers) == 4


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_packed_rows_are_seqio_packed_with_restarting_positions(bench, family):
  cfg = bench.make_config(family, bench.Shape(length=256, dtype="float32", attention="reference"),
                          "none", 1, packed=True)
  local = next(SyntheticData(cfg).train(4, 0, 1))
  packed = bench.pack_rows(local, family, docs=4)
  keys = ["decoder_segment_ids"] + (["encoder_segment_ids"] if family == "redllm" else [])
  for key in keys:
    ids = packed[key]
    bad, most = cudnn_packed.layout_problems(ids)
    assert not bad.any() and (ids > 0).all() and most.max() > 1
  cudnn_packed.check_batch(16, packed)  # Rows cuDNN's packed layout takes.
  dec = packed["decoder_segment_ids"][0]
  starts = np.flatnonzero(np.diff(dec)) + 1
  if family == "decllm":
    assert (packed["decoder_positions"][0][starts] == 0).all()
    assert (packed["decoder_input_tokens"][0][starts] == 0).all()
  else:  # Continuous positions: a decoder segment continues after its encoder segment.
    enc = packed["encoder_segment_ids"][0]
    np.testing.assert_array_equal(packed["decoder_positions"][0][starts],
                                  np.bincount(enc)[dec[starts]])
    assert (packed["decoder_segment_ids"].max(1) == packed["encoder_segment_ids"].max(1)).all()
  # The mask the model builds from these ids isolates the documents.
  m = masks.self_attention_mask(jnp.asarray(packed["decoder_segment_ids"][:1]), kind="causal")
  assert not bool(m[0, 0, starts[0], starts[0] - 1])


def test_decode_floor_counts_weights_and_cache(bench):
  dec = ModelConfig(family="decllm", vocab_size=100, d_model=8, num_heads=2, num_kv_heads=1,
                    head_dim=4, d_ff=16, num_layers=3, dtype="bfloat16")
  params = {"embedding": {"table": np.zeros((100, 8), np.float32)},
            "decoder": {"w": np.zeros((3, 8, 8), np.float32)}}
  weights = (800 + 192) * 4
  kv = 2 * 1 * 4 * 2 * 5  # K and V, one kv head of 4, bf16, batch 5.
  assert bench.decode_floor_bytes(dec, params, 5, 10) == weights + 3 * kv * 10
  red = ModelConfig(family="redllm", vocab_size=100, d_model=8, num_heads=2, head_dim=4, d_ff=16,
                    num_encoder_layers=7, num_decoder_layers=2, dtype="bfloat16")
  red_params = {**params, "encoder": {"w": np.zeros((7, 8, 8), np.float32)}}
  kv = 2 * 2 * 4 * 2 * 5
  # The encoder's weights are not read by a decode step; its keys/values are, per layer.
  assert bench.decode_floor_bytes(red, red_params, 5, 10, encoder_length=20) == (
      weights + 2 * kv * (10 + 20))
  assert bench.hbm_bandwidth("NVIDIA H100 80GB HBM3") == 3.35e12
  assert bench.hbm_bandwidth("NVIDIA H200") == 4.8e12
  assert flops.peak_flops_per_device.__module__  # H100/H200 peaks: flops._PEAKS.
  assert dict(flops._PEAKS)["h100"] == dict(flops._PEAKS)["h200"] == 989e12


def test_trace_split_sums_gpu_stream_kernels_by_class(bench):
  events = [
      {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
      {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
      {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "Stream #13"}},
      {"ph": "M", "name": "thread_name", "pid": 1, "tid": 8, "args": {"name": "XLA Ops"}},
      {"ph": "X", "pid": 1, "tid": 7, "name": "sm90_xmma_gemm_bf16bf16", "dur": 3000},
      {"ph": "X", "pid": 1, "tid": 7, "name": "nvjet_tst_128x256", "dur": 1000},
      {"ph": "X", "pid": 1, "tid": 7, "name": "cudnn_generated_fort_native_sdpa_sm90", "dur": 2000},
      {"ph": "X", "pid": 1, "tid": 7, "name": "ncclDevKernel_AllReduce_Sum", "dur": 500},
      {"ph": "X", "pid": 1, "tid": 7, "name": "loop_add_fusion", "dur": 250},
      {"ph": "X", "pid": 1, "tid": 8, "name": "dot.3", "dur": 9999},  # Repeats stream time.
      {"ph": "X", "pid": 2, "tid": 1, "name": "gemm on the host", "dur": 9999},
  ]
  assert bench.time_split(events) == {"products": 4.0, "attention": 2.0, "collectives": 0.5,
                                      "other": 0.25}


def test_results_row_for_the_docs_table(bench):
  base = {"attention": "cudnn", "mfu": 0.4}
  rows = [{**base, "row": "decllm remat=none micro=1", "family": "decllm", "packed": False,
           "step_ms": 100.0, "tokens_s": 160e3},
          {**base, "row": "decllm remat=full micro=1", "family": "decllm", "packed": False,
           "step_ms": 130.0, "tokens_s": 120e3, "mfu": 0.3},
          {**base, "row": "decllm packed", "family": "decllm", "packed": True, "step_ms": 105.0,
           "tokens_s": 150e3, "mfu": 0.38},
          {**base, "row": "decllm packed, reference attention", "family": "decllm",
           "packed": True, "attention": "reference", "step_ms": 90.0, "tokens_s": 1.0},
          {"row": "decllm decode batch 1", "step_ms": 2.5, "of_floor": 0.6, "tokens_s": 400.0}]
  row = bench.table_row("NVIDIA H100", "0.10.2", "2026-11-27", rows)
  assert row == ("| NVIDIA H100 | 0.10.2 | 2026-11-27 | 40 % / 160k, 38 % / 150k | -, - | - | "
                 "2.50 (60 %) / - / - / - |")


@pytest.mark.slow
def test_smoke_run_end_to_end(bench, tmp_path):
  rows = bench.main(["--smoke", "--steps", "1", "--json", str(tmp_path / "rows.json")])
  names = [r["row"] for r in rows]
  assert {"decllm packed", "redllm packed", "decllm decode batch 1"} <= set(names), names
  assert all(r["tokens_s"] != 0 for r in rows)
  assert (tmp_path / "rows.json").exists()
