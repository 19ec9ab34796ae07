"""benchmarks/gpu_train.py, gpu_decode.py and gpu_flags.py (``make bench-gpu``,
``benchmarks/gpu_session.sh``), checked on CPU: the FLOP counting is ``flops.train_flops`` at the
paper's 1B shapes (MoE: the experts a token uses), the packed rows are seqio-packed, the decode
floor counts the bytes a step reads (its weights: the products ``flops.py`` counts), the kernel
counts read a compiled loop body and a trace, the flag variants parse, the docs row is built from
the rows; the ``--smoke`` modes of the MoE training rows and of decode under a flag variant run
here, the whole of ``gpu_train.py --smoke`` in ``make test-slow``."""
from __future__ import annotations

import dataclasses
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5like.config import ModelConfig, paper_model
from t5like.config.moe import paper_moe
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
    from benchmarks import gpu_decode, gpu_flags, gpu_train
  finally:
    sys.path[:] = path
  gpu_train.decode, gpu_train.flags = gpu_decode, gpu_flags
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
          {**base, "row": "decllm moe capacity remat=none micro=1", "family": "decllm",
           "packed": False, "moe": "capacity", "step_ms": 50.0, "tokens_s": 9e9},
          {"row": "decllm moe dropless", "moe": "dropless", "error": "does not fit"},
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


@pytest.mark.parametrize("family, dec, enc", [("decllm", 2048, 0), ("redllm", 1024, 1024)])
def test_moe_rows_count_the_flops_of_the_experts_a_token_uses(bench, family, dec, enc):
  dense = bench.make_config(family, bench.Shape(), "dots", 1, packed=False)
  rows = {}
  for kind, factor in (("dropless", 0.0), ("capacity", 1.25)):
    cfg = bench.make_config(family, bench.Shape(moe=kind), "dots", 1, packed=False)
    assert cfg.model.moe == dataclasses.replace(paper_moe(8192), capacity_factor=factor)
    rows[kind] = bench.train_numbers(cfg, 0.5, 989e12, dec, enc)
    assert rows[kind]["flops"] == flops.train_flops(cfg.model, 8, dec, enc)
  moe = paper_moe(8192)
  assert (moe.top_k + moe.num_shared_experts) * moe.expert_d_ff == 8192  # The dense d_ff.
  # So the active feed-forward FLOPs equal the dense ones; the MoE layers (all but the first of
  # each stack) add their router, 2 FLOPs per token per routed expert per d_model, forward.
  layers = [(15, 2048)] if family == "decllm" else [(6, 1024), (6, 1024)]
  router = 3 * sum(n * 2 * 8 * s * 2048 * 64 for n, s in layers)
  want = bench.train_numbers(dense, 0.5, 989e12, dec, enc)["flops"] + router
  assert rows["dropless"]["flops"] == rows["capacity"]["flops"] == want
  assert rows["dropless"]["mfu"] == pytest.approx(want / 0.5 / 989e12, rel=1e-12)


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_decode_floor_weights_are_the_products_flops_counts(bench, family):
  """The floor's weights of a bf16 model in its decode layout: 2 bytes per parameter of every
  product one token runs (``flops.forward_flops`` of one token, 2 FLOPs per parameter, less the
  attention over one key), 4 per norm scale; the encoder's stay out (RedLLM)."""
  from flax import nnx

  from t5like.inference import generation
  from t5like.models import build_model
  shape = dataclasses.replace(bench.bench_shape(True, False), dtype="bfloat16")
  cfg = bench.make_config(family, shape, "none", 1, False).model
  params = generation.Generator(build_model(cfg, nnx.Rngs(0)))._params
  leaves = [(jax.tree_util.keystr(p), x)
            for p, x in jax.tree_util.tree_flatten_with_path(params)[0]]
  norms = sum(x.size * 4 for k, x in leaves if "norm" in k and not k.startswith("['encoder"))
  attn = 2 * cfg.num_heads * cfg.head_dim  # 4 H d_h per key, halved when causal.
  if family == "decllm":
    products = flops.forward_flops(cfg, 1, 1) - cfg.num_layers * attn
  else:  # Decoder layers (self + cross attention over one encoder key) and the logits.
    no_dec = dataclasses.replace(cfg, num_decoder_layers=0)
    products = (flops.forward_flops(cfg, 1, 1, 1) - flops.forward_flops(no_dec, 1, 1, 1)
                - cfg.num_decoder_layers * (3 * attn + 2 * cfg.d_model * 2 * cfg.kv_heads
                                            * cfg.head_dim)  # Cross K/V: cached at prefill.
                + flops.forward_flops(dataclasses.replace(no_dec, num_encoder_layers=0), 1, 1, 1))
  assert bench.decode_floor_bytes(cfg, params, 1, 0) == 2 * products / 2 + norms


HLO = """HloModule jit_run, is_scheduled=true

%fused_a (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %n = f32[4]{0} negate(%p)
}

%command_buffer (p0: f32[4], p1: f32[4]) -> (f32[4], f32[4]) {
  %p0 = f32[4]{0} parameter(0)
  %p1 = f32[4]{0} parameter(1)
  %f1 = f32[4]{0} fusion(%p0), kind=kLoop, calls=%fused_a
  %f2 = f32[4]{0} fusion(%p1), kind=kInput, calls=%fused_a
  ROOT %t = (f32[4]{0}, f32[4]{0}) tuple(%f1, %f2)
}

%body (arg: (s32[], f32[4])) -> (s32[], f32[4]) {
  %arg = (s32[], f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%arg), index=0
  %x = f32[4]{0} get-tuple-element(%arg), index=1
  %c = s32[] constant(1)
  %g = (f32[4]{0}, s8[0]{0}) custom-call(%x, %x), custom_call_target="__cublas$gemm"
  %y = f32[4]{0} get-tuple-element(%g), index=0
  %cb = (f32[4]{0}, f32[4]{0}) call(%y, %x), to_apply=%command_buffer
  %z = f32[4]{0} bitcast(%y)
  %j = s32[] fusion(%i, %c), kind=kLoop, calls=%fused_a
  ROOT %out = (s32[], f32[4]{0}) tuple(%j, %z)
}

%cond (arg.1: (s32[], f32[4])) -> pred[] {
  %arg.1 = (s32[], f32[4]{0}) parameter(0)
  ROOT %lt = pred[] fusion(%arg.1), kind=kLoop, calls=%fused_a
}

ENTRY %main (x.1: f32[4]) -> f32[4] {
  %x.1 = f32[4]{0} parameter(0)
  %pre = f32[4]{0} fusion(%x.1), kind=kLoop, calls=%fused_a
  %w = (s32[], f32[4]{0}) while(%init), condition=%cond, body=%body
  ROOT %r = f32[4]{0} get-tuple-element(%w), index=1
}
"""


def test_loop_kernels_count_one_iteration_of_the_decode_loop(bench):
  got = bench.decode.loop_kernels(HLO)
  # Body: the gemm, the command buffer's two fusions, the counter fusion; the condition's fusion.
  assert got["kernels"] == 5
  assert got["launches"] == 4  # The command buffer launches once.
  assert got["by_kind"] == {"custom-call:__cublas$gemm": 1, "fusion:Loop": 3, "fusion:Input": 1}
  assert bench.decode.loop_kernels(HLO.replace("while(", "call(")) == {
      "kernels": 0, "launches": 0, "by_kind": {}}


def test_trace_kernels_count_gpu_stream_kernels(bench):
  events = [
      {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
      {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
      {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "Stream #13"}},
      {"ph": "X", "pid": 1, "tid": 7, "name": "loop_fusion", "dur": 3},
      {"ph": "X", "pid": 1, "tid": 7, "name": "nvjet_gemm", "dur": 500},
      {"ph": "X", "pid": 1, "tid": 8, "name": "XLA Ops line", "dur": 999},
      {"ph": "X", "pid": 2, "tid": 1, "name": "host work", "dur": 999},
  ]
  assert bench.decode.trace_kernels(events) == (2, 0.503)


def test_flag_variants_parse_and_a_bad_flag_is_named(bench):
  flags = bench.flags
  assert flags.check(list(flags.VARIANTS)) == {name: "ok" for name in flags.VARIANTS}
  bad = flags._probe(flags.Variant("bad", ("--xla_gpu_no_such_flag=1",)), 120)
  assert bad != "ok" and "xla_gpu_no_such_flag" in bad
  env = flags.variant_env(flags.VARIANTS["ragged_dot_cudnn"], {"XLA_FLAGS": "--a=1"})
  assert env["XLA_FLAGS"] == "--a=1 --xla_gpu_experimental_use_ragged_dot_fusion=true"
  assert flags.variant_env(flags.VARIANTS["ragged_dot_triton"], {})[
      "JAX_RAGGED_DOT_USE_GPU_PALLAS_TRITON_LOWERING"] == "1"
  with pytest.raises(SystemExit):
    flags._args(["--variants", "default,nope"])


@pytest.mark.slow  # make test's 15-minute budget on 2 cores (docs/tests.md)
def test_decode_smoke_under_a_flag_variant_in_its_own_process(bench, tmp_path):
  out = tmp_path / "ab.json"
  rows = bench.flags.main(["--bench", "decode", "--variants", "no_command_buffer", "--smoke",
                           "--timeout_s", "600", "--json", str(out), "--",
                           "--families", "decllm", "--batches", "1"])
  assert [r["row"] for r in rows] == ["decllm decode batch 1"], rows
  row = rows[0]
  assert row["variant"] == "no_command_buffer" and row["device"] == "cpu"
  assert row["jax"] == jax.__version__ and row["date"]
  assert "--xla_gpu_enable_command_buffer=" in row["xla_flags_seen"].split()  # Reached the run.
  assert row["hlo_kernels"] > 0 and row["hlo_by_kind"] and row["floor_bytes"] > 0
  assert json.loads(out.read_text())["rows"] == rows


@pytest.mark.slow  # make test's 15-minute budget on 2 cores (docs/tests.md)
def test_train_smoke_moe_capacity_row(bench, tmp_path):
  rows = bench.main(["--smoke", "--steps", "1", "--families", "decllm", "--no_dense",
                     "--no_peer", "--no_decode", "--moe", "capacity",
                     "--json", str(tmp_path / "rows.json")])
  assert [r["row"] for r in rows] == ["decllm moe capacity remat=full micro=1"]
  moe = rows[0]
  cfg = bench.make_config("decllm", dataclasses.replace(
      bench.bench_shape(True, False), moe="capacity"), "full", 1, False)
  assert moe["moe"] == "capacity" and moe["flops"] == flops.train_flops(cfg.model, 2, 64)
  dense = bench.make_config("decllm", bench.bench_shape(True, False), "full", 1, False)
  assert moe["flops"] > flops.train_flops(dense.model, 2, 64)  # The router's products.
  assert moe["tokens_s"] > 0 and moe["mfu"] > 0
  saved = json.loads((tmp_path / "rows.json").read_text())
  assert saved["device"] == "cpu" and saved["jax"] == jax.__version__ and saved["date"]


def test_ragged_products_smoke_rows(bench):
  from benchmarks import gpu_ragged
  sizes = gpu_ragged.group_sizes(50, 8, 3)
  assert sizes.sum() == 150 and sizes.shape == (8,) and (sizes <= 50).all()
  rows = gpu_ragged.rows(50, 16, 8, 8, 3, jnp.float32, 1)
  names = [r["row"] for r in rows]
  assert names == ["moe products: dense GEMM, same FLOPs", "moe products: ragged_dot forward",
                   "moe products: ragged_dot forward+backward",
                   "moe products: capacity 1.25 batched einsum forward"]  # No Hopper kernel.
  assert all("error" not in r and r["ms"] > 0 and r["m"] == 150 for r in rows), rows
  assert rows[0]["flops"] == rows[1]["flops"] == 2 * 150 * 16 * 8 == rows[2]["flops"] / 3
  assert rows[3]["flops"] == 2 * 8 * 24 * 16 * 8  # ceil(1.25 * 150 / 8) = 24 rows per expert.


def test_session_summary_tables_every_saved_row(bench, tmp_path):
  from benchmarks import gpu_report
  (tmp_path / "decode.json").write_text(json.dumps({
      "device": "NVIDIA H200", "jax": "0.11.2", "date": "2026-12-02 04:00 UTC",
      "rows": [{"row": "decllm decode batch 1", "step_ms": 1.5, "hlo_kernels": 460}]}))
  (tmp_path / "ab.json").write_text(json.dumps({"rows": [
      {"row": "variant x: timed out after 54 s", "variant": "x", "device": "NVIDIA H100",
       "jax": "0.10.2", "date": "2026-12-02", "error": "timed out after 54 s"}]}))
  lines = gpu_report.summary([str(tmp_path)]).splitlines()
  assert len(lines) == 4
  assert lines[2].startswith("| ab.json | NVIDIA H100 | 0.10.2 | 2026-12-02 | variant x")
  assert "timed out after 54 s |" in lines[2]
  assert lines[3].startswith("| decode.json | NVIDIA H200 | 0.11.2 | 2026-12-02 04:00 UTC | "
                             "decllm decode batch 1 |  | 1.5 |")
  assert "| 460 |" in lines[3]
