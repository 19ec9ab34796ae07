#!/usr/bin/env python
"""DecLLM and RedLLM at the paper's 1B widths on one GPU: train-step MFU, tokens/s and memory,
packed and unpacked, against transformers' Llama on PyTorch in the same run; greedy decode
against the HBM-bandwidth floor (``make bench-gpu``; < 8 minutes on one H100 / H200).

  python benchmarks/gpu_train.py [--steps 5] [--layers 0] [--batch 8] [--budget_s 420]
                                 [--families decllm,redllm] [--remats none,dots,full]
                                 [--no_peer] [--no_decode] [--no_packed] [--no_dense]
                                 [--moe capacity,dropless] [--capacity_factor 1.25]
                                 [--profile_dir DIR] [--json out.json] [--smoke]

Models: ``paper_model(family, "1b")`` (d2048, 16 x 128 heads, SwiGLU 8192, vocab 32768, tied;
DecLLM 16 layers, RedLLM 7 + 7), bf16 compute with f32 parameters and Adafactor (the paper's
optimizer), ``attention_impl="cudnn"``; DecLLM rows of 2048 tokens, RedLLM 1024 + 1024;
``--layers N`` keeps N layers (RedLLM N + N) where memory demands and says so in every row.
For each family a small search (remat ``none`` / ``dots`` / ``full``, two microbatches where one
does not fit) picks the fastest setting on unpacked rows; the packed row (documents of ~512
tokens packed with segment ids: cuDNN's packed layout) uses it. Then the peer and decode; last,
budget allowing, packed DecLLM on the reference attention core (what ``auto`` picks where
cuDNN cannot serve a config). Rows are printed and saved (``--json``) as they come.

Counting (docs/flops.md, ``flops.train_flops``): every position of a row counts as a token, MFU
is model FLOPs per second over the card's dense bf16 peak (``flops.peak_flops_per_device``: H100
and H200 989 TFLOP/s). Memory is the compiled step's peak per device (arguments + temporaries).
Step time: the median of ``--steps`` steps after one warm-up step.

The peer: ``transformers.LlamaForCausalLM`` of the DecLLM shapes (tied embeddings, same batch and
length), bf16 weights, AdamW (fused), PyTorch's SDPA (flash) attention; only when torch and
transformers are installed (never a dependency of this project).

Decode (``gpu_decode.py``): batch 1 and 8, 128-token prompts, greedy; the per-token step time is
the difference of two generation lengths (prefill and compilation cancel). Its floor: bytes of
the weights read per step (RedLLM: not the encoder's) plus the KV cache at the mean context,
over the card's HBM bandwidth (H100 SXM 3.35 TB/s, H200 4.8 TB/s).

MoE (``--moe``): the feed-forwards of configs/{decllm,redllm}_1b_moe.py (64 routed experts of
d_ff / 8, top-7, + 1 shared, the first layer dense) at the same shapes, ``dropless``
(``jax.lax.ragged_dot``) and ``capacity`` (fixed expert buffers, ``--capacity_factor``), each
kind for every family before the next kind; MFU counts the experts a token uses (``flops.py``),
so an MoE row and its dense row share a yardstick. Rows that fail say why and the rest run.

``--profile_dir``: a ``jax.profiler`` trace of two steps of the fastest DecLLM setting, and the
step's GPU time split into products, attention, collectives and the rest (by kernel name).
``--smoke``: a tiny shape that runs anywhere (CPU: the reference attention core, float32), for
tests.
Every ``--json`` file records the card, the JAX version, the date and XLA_FLAGS.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # A checkout.
# JAX takes GPU memory as it needs it rather than 75 % of the card at start: the PyTorch peer
# runs in the same process after the JAX rows.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import timing  # noqa: E402
from benchmarks.gpu_decode import decode_floor_bytes, decode_rows, hbm_bandwidth  # noqa: E402,F401
from benchmarks.gpu_report import table_row, time_split, trace_split  # noqa: E402,F401
from t5like import partitioning  # noqa: E402
from t5like.config import Config, ConfigError, paper_model  # noqa: E402
from t5like.config.moe import paper_moe  # noqa: E402
from t5like.ops import cudnn_packed  # noqa: E402
from t5like.training import aot, flops  # noqa: E402
from t5like.training import state as state_lib  # noqa: E402
from t5like.training import step as step_lib  # noqa: E402
from t5like.training.data import SyntheticData, global_batch  # noqa: E402

GiB = 1024 ** 3
REMAT_SEARCH = ("none", "dots", "full")
DOCS_PER_ROW = 4  # Mean documents per packed row (~512 tokens each at 2048).


@dataclasses.dataclass
class Shape:
  """What a row trains: the model's layers and the batch (rows x lengths)."""
  layers: int = 0  # 0 = the paper's (DecLLM 16, RedLLM 7 + 7).
  batch: int = 8
  length: int = 2048  # DecLLM row; RedLLM: length // 2 input + length // 2 target.
  dtype: str = "bfloat16"
  attention: str = "cudnn"
  d_model: int = 0  # 0 = the paper's 1B widths; --smoke shrinks them.
  moe: str = ""  # "": dense; "dropless" / "capacity": configs/*_1b_moe.py's feed-forwards.
  capacity_factor: float = 1.25  # The capacity path's model.moe.capacity_factor.


def bench_shape(smoke: bool, gpu: bool, layers: int = 0, batch: int = 8) -> Shape:
  """The benchmark's shape: the paper's 1B (``--smoke``: tiny widths, 2 layers: the MoE configs
  keep their first layer dense); off a GPU float32 with the reference attention core (cuDNN:
  GPUs only)."""
  shape = Shape(layers=layers, batch=batch)
  if smoke:
    shape = Shape(layers=2, batch=2, length=64, d_model=64)
  if not gpu:
    shape = dataclasses.replace(shape, dtype="float32", attention="reference")
  return shape


def save_rows(path: str, dev, rows: list[dict]) -> None:
  """The rows so far, with the card, the JAX version and the date, to ``path`` (JSON)."""
  with open(path, "w") as f:
    json.dump({"device": dev.device_kind, "jax": jax.__version__,
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "xla_flags": os.environ.get("XLA_FLAGS", ""), "rows": rows}, f, indent=1)


def make_config(family: str, shape: Shape, remat: str, microbatches: int,
                packed: bool) -> Config:
  cfg = Config()
  m = paper_model(family, "1b")
  if shape.d_model:  # Smoke: small widths, the same structure.
    m = dataclasses.replace(m, d_model=shape.d_model, num_heads=4, head_dim=16,
                            d_ff=4 * shape.d_model, vocab_size=512)
  if shape.layers:
    m = dataclasses.replace(m, num_layers=shape.layers, num_encoder_layers=shape.layers,
                            num_decoder_layers=shape.layers)
  if shape.moe:  # 64 routed experts of d_ff / 8, top-7, + 1 shared: the dense model's active FFN.
    m = dataclasses.replace(m, moe=dataclasses.replace(
        paper_moe(m.d_ff), capacity_factor=shape.capacity_factor if shape.moe == "capacity"
        else 0.0))
  cfg.model = dataclasses.replace(m, dtype=shape.dtype, attention_impl=shape.attention,
                                  remat_policy=remat, max_segments_per_row=0 if packed else 1)
  cfg.data.sequence_length = shape.length
  cfg.data.inputs_length = cfg.data.targets_length = shape.length // 2
  cfg.data.pack = packed
  cfg.train.batch_size, cfg.train.microbatches = shape.batch, microbatches
  cfg.train.steps, cfg.train.warmup_steps = 1000, 10
  return cfg.validate()


def _segments(rng: np.random.Generator, length: int, count: int) -> np.ndarray:
  """Segment ids 1..count over ``length`` positions, cut at random points (each >= 1 token)."""
  cuts = np.sort(rng.choice(np.arange(1, length), size=count - 1, replace=False))
  ids = np.zeros(length, np.int32)
  ids[cuts] = 1
  return np.cumsum(ids).astype(np.int32) + 1


def _positions(ids: np.ndarray, start: np.ndarray | None = None) -> np.ndarray:
  """Position within each segment (+ ``start[segment]``: RedLLM's continuous positions)."""
  first = np.searchsorted(ids, ids)  # ids are sorted: index of each segment's first token.
  pos = np.arange(ids.size) - first
  return (pos + (start[ids - 1] if start is not None else 0)).astype(np.int32)


def pack_rows(batch: dict, family: str, seed: int = 0, docs: float = DOCS_PER_ROW) -> dict:
  """The synthetic rows cut into ~``docs`` documents each (Poisson; every position used, as
  seqio fills a row): segment ids 1..n and positions restarting per document. RedLLM: the same
  n documents split both the input and the target row."""
  rng = np.random.default_rng(seed)
  out = {k: np.array(v) for k, v in batch.items()}
  red = family == "redllm"
  for r in range(out["decoder_segment_ids"].shape[0]):
    n = max(1, int(rng.poisson(docs)))
    dec = _segments(rng, out["decoder_segment_ids"].shape[1], n)
    out["decoder_segment_ids"][r] = dec
    if red:
      enc = _segments(rng, out["encoder_segment_ids"].shape[1], n)
      out["encoder_segment_ids"][r] = enc
      out["encoder_positions"][r] = _positions(enc)
      out["decoder_positions"][r] = _positions(dec, np.bincount(enc)[1:])
    else:
      out["decoder_positions"][r] = _positions(dec)
      out["decoder_input_tokens"][r][np.searchsorted(dec, dec) == np.arange(dec.size)] = 0  # BOS.
  return out


def train_numbers(cfg: Config, step_s: float, peak: float, dec_len: int, enc_len: int) -> dict:
  """Model FLOPs (docs/flops.md), tokens/s (every position) and MFU of one step."""
  b = cfg.train.batch_size
  f = flops.train_flops(cfg.model, b, dec_len, enc_len)
  return {"flops": f, "tokens_s": b * (dec_len + enc_len) / step_s,
          "tflops_s": f / step_s / 1e12, "mfu": f / step_s / peak if peak else float("nan")}


def train_row(name: str, cfg: Config, steps: int, packed: bool, peak: float,
              profile_dir: str = "") -> dict:
  """Compiles (memory checked: a step that cannot fit is a ConfigError) and times ``cfg``."""
  setup = state_lib.build_setup(cfg, partitioning.make_mesh(cfg.mesh))
  local = next(SyntheticData(cfg).train(cfg.train.batch_size, 0, 1))
  if packed:
    local = pack_rows(local, cfg.model.family)
    if cfg.model.attention_impl == "cudnn":
      cudnn_packed.check_batch(cfg.model.max_segments_per_row, local)
  batch = global_batch(local, setup.batch_sharding, cfg.train.batch_size)
  t0 = time.perf_counter()
  train_step = step_lib.make_train_step(setup)
  compiled = aot.compile_checked(cfg, setup, train_step.lower(setup.abstract_state, batch))
  compile_s = time.perf_counter() - t0
  held = {"state": state_lib.init_state(setup)}

  def step():
    held["state"], metrics = compiled(held["state"], batch)
    jax.block_until_ready(metrics)
  step_s = timing.median_seconds(step, steps)
  if profile_dir:
    jax.profiler.start_trace(profile_dir)
    for _ in range(2):
      step()
    jax.profiler.stop_trace()
  dec, enc = flops.batch_lengths(batch)
  m = cfg.model
  return {"row": name, "family": m.family, "layers": m.num_layers if m.family == "decllm" else
          f"{m.num_encoder_layers}+{m.num_decoder_layers}", "params_m": setup.num_params / 1e6,
          "attention": m.attention_impl, "packed": packed,
          "moe": ("capacity" if m.moe.capacity_factor > 0 else "dropless") if m.moe.enabled
          else "", "remat": m.remat_policy,
          "micro": cfg.train.microbatches, "shape": f"{cfg.train.batch_size}x" + (
              f"{enc}+{dec}" if enc else f"{dec}"), "step_ms": step_s * 1e3,
          "peak_gib": aot.memory_per_device(compiled)["peak"] / GiB, "compile_s": compile_s,
          **train_numbers(cfg, step_s, peak, dec, enc)}


def search(family: str, shape: Shape, steps: int, peak: float, deadline: float,
           remats, add) -> list[dict]:
  """Unpacked rows over remat policies (two microbatches where one does not fit); stops early
  past ``deadline`` once one setting ran. ``add`` reports each row as it comes."""
  rows = []
  label = f"{family} moe {shape.moe}" if shape.moe else family
  for remat in remats:
    if rows and time.time() > deadline:
      print(f"  (budget spent: remat {remat} not tried)", flush=True)
      break
    for micro in (1, 2):
      try:
        rows.append(train_row(f"{label} remat={remat} micro={micro}",
                              make_config(family, shape, remat, micro, False), steps, False,
                              peak))
        add(rows[-1])
        break
      except ConfigError as e:  # Does not fit: try two microbatches, then the next policy.
        print(f"  {label} remat={remat} micro={micro}: does not fit ({str(e)[:120]}...)",
              flush=True)
  return rows


def peer_row(shape: Shape, steps: int, peak: float) -> dict | None:
  """transformers' Llama of the DecLLM shapes, bf16, AdamW, SDPA; None without torch."""
  try:
    import torch
    import transformers
  except ImportError:
    return None
  m = make_config("decllm", shape, "none", 1, False).model
  b, s = shape.batch, shape.length
  torch.manual_seed(0)
  config = transformers.LlamaConfig(
      vocab_size=m.vocab_size, hidden_size=m.d_model, intermediate_size=m.d_ff,
      num_hidden_layers=m.num_layers, num_attention_heads=m.num_heads,
      num_key_value_heads=m.kv_heads, head_dim=m.head_dim, max_position_embeddings=s,
      tie_word_embeddings=True)  # Attention: transformers' default, PyTorch SDPA (flash).
  device = "cuda" if torch.cuda.is_available() else "cpu"
  model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).to(device).train()
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
  ids = torch.randint(2, m.vocab_size, (b, s), device=device)

  def step():
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if device == "cuda":
      torch.cuda.synchronize()
  if device == "cuda":
    torch.cuda.reset_peak_memory_stats()
  step_s = timing.median_seconds(step, steps)
  mem = torch.cuda.max_memory_allocated() / GiB if device == "cuda" else float("nan")
  f = flops.train_flops(m, b, s, 0)
  attn = getattr(model.config, "_attn_implementation", None) or "default"
  return {"row": f"peer: transformers Llama ({attn} attention), AdamW, bf16", "family": "decllm",
          "layers": m.num_layers, "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
          "attention": attn, "packed": False, "remat": "none", "micro": 1,
          "shape": f"{b}x{s}", "step_ms": step_s * 1e3, "peak_gib": mem, "compile_s": 0.0,
          "flops": f, "tokens_s": b * s / step_s, "tflops_s": f / step_s / 1e12,
          "mfu": f / step_s / peak if peak else float("nan")}


def _format(r: dict) -> str:
  keys = ("row", "layers", "attention", "packed", "remat", "micro", "shape", "step_ms",
          "tokens_s", "mfu", "peak_gib", "compile_s")
  return "  " + " | ".join(f"{r[k]:.4g}" if isinstance(r[k], float) else str(r[k]) for k in keys)


def _args(argv=None) -> argparse.Namespace:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--steps", type=int, default=5, help="timed steps per row (median)")
  ap.add_argument("--layers", type=int, default=0, help="layers (RedLLM N+N); 0 = the paper's")
  ap.add_argument("--batch", type=int, default=8, help="rows per step")
  ap.add_argument("--budget_s", type=float, default=420.0,
                  help="seconds after which the remat search and optional rows stop")
  ap.add_argument("--families", default="decllm,redllm", help="comma list of model families")
  ap.add_argument("--remats", default=",".join(REMAT_SEARCH), help="remat policies searched")
  ap.add_argument("--no_peer", action="store_true", help="skip the PyTorch peer")
  ap.add_argument("--no_decode", action="store_true", help="skip the decode rows")
  ap.add_argument("--no_packed", action="store_true", help="skip the packed and extra rows")
  ap.add_argument("--no_dense", action="store_true",
                  help="skip the dense rows (MoE rows then take the first of --remats)")
  ap.add_argument("--moe", default="", help="MoE rows after the dense ones: comma list of "
                  "dropless (ragged_dot), capacity (fixed expert buffers)")
  ap.add_argument("--capacity_factor", type=float, default=1.25,
                  help="model.moe.capacity_factor of the capacity rows")
  ap.add_argument("--profile_dir", default="", help="trace two steps of the best DecLLM here")
  ap.add_argument("--json", default="", help="also write the rows to this JSON file")
  ap.add_argument("--smoke", action="store_true", help="tiny shapes (any device), for tests")
  args = ap.parse_args(argv)
  bad = [m for m in args.moe.split(",") if m and m not in ("dropless", "capacity")]
  if bad:
    ap.error(f"--moe takes dropless and/or capacity, got {bad}")
  return args


def packed_row(family: str, name: str, shape: Shape, best: dict, steps: int, peak: float,
               profile_dir: str = "") -> dict | None:
  """A packed row at the unpacked search's best setting; None (said) where it does not fit."""
  try:
    return train_row(name, make_config(family, shape, best["remat"], best["micro"], True), steps,
                     True, peak, profile_dir=profile_dir)
  except (ConfigError, jax.errors.JaxRuntimeError) as e:  # Compiled, but the card ran out.
    if isinstance(e, jax.errors.JaxRuntimeError) and "RESOURCE_EXHAUSTED" not in str(e):
      raise
    print(f"  {name} remat={best['remat']} micro={best['micro']}: {str(e)[:160]}...", flush=True)
    return None


def moe_rows(family: str, shape: Shape, kinds: list[str], best: dict | None, steps: int,
             peak: float, deadline: float, add) -> None:
  """MoE rows of ``family`` (configs/*_1b_moe.py's feed-forwards at the dense shapes): per kind
  (dropless, capacity) the dense search's best remat, else ``full``; MFU on the FLOPs of the
  experts a token uses (``flops.train_flops``). A kind that fails (memory, a lowering the JAX
  lacks) gives a row saying so; the next kind still runs."""
  remats = tuple(dict.fromkeys([best["remat"] if best else "full", "full"]))
  for kind in kinds:
    name = f"{family} moe {kind}"
    if time.time() > deadline:
      print(f"  (budget spent: {name} not run)", flush=True)
      continue
    try:
      if not search(family, dataclasses.replace(shape, moe=kind), steps, peak, deadline,
                    remats, add):
        add({"row": name, "moe": kind, "error": "does not fit"})
    except Exception as e:  # noqa: BLE001 -- reported as a row; the other rows still run.
      print(f"  {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
      add({"row": name, "moe": kind, "error": f"{type(e).__name__}: {str(e)[:300]}"})


def main(argv=None) -> list[dict]:
  """The rows in order of what the targets need: per family the search and the packed cuDNN row,
  the peer, the MoE rows (``--moe``), decode; then, budget allowing, packed DecLLM on the
  reference attention core (what ``auto`` picks where cuDNN cannot serve a config)."""
  args = _args(argv)
  start = time.time()
  deadline = start + args.budget_s
  dev = jax.devices()[0]
  gpu = dev.platform == "gpu"
  shape = bench_shape(args.smoke, gpu, args.layers, args.batch)
  shape = dataclasses.replace(shape, capacity_factor=args.capacity_factor)
  peak = flops.peak_flops_per_device(0.0, shape.dtype)
  print(f"device: {dev.device_kind} ({dev.platform}); JAX {jax.__version__}; peak "
        f"{peak / 1e12:.0f} TFLOP/s; HBM {hbm_bandwidth(dev.device_kind) / 1e12:.2f} TB/s; "
        f"layers {'paper' if not shape.layers else shape.layers}; "
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}", flush=True)
  rows: list[dict] = []

  def add(row: dict | None) -> None:  # Printed and saved as it comes: a timeout keeps the rest.
    if row is None:
      return
    rows.append(row)
    if "family" in row:  # Train rows; gpu_decode prints its own.
      print(_format(row), flush=True)
    if args.json:
      save_rows(args.json, dev, rows)

  families = [f for f in args.families.split(",") if f]
  best = {}
  for family in [] if args.no_dense else families:
    found = search(family, shape, args.steps, peak, deadline,
                   ("full",) if args.smoke else tuple(args.remats.split(",")), add)
    if found:
      best[family] = min(found, key=lambda r: r["step_ms"])
      if not args.no_packed:
        add(packed_row(family, f"{family} packed", shape, best[family], args.steps, peak,
                       args.profile_dir if family == "decllm" else ""))
  if not args.no_peer and (gpu or args.smoke):
    peer = peer_row(shape, args.steps, peak)
    if peer is None:
      print("  peer: torch / transformers not installed", flush=True)
    add(peer)
  kinds = [k for k in args.moe.split(",") if k]
  first = {"remat": args.remats.split(",")[0]} if args.no_dense and not args.smoke else None
  for kind, family in [(k, f) for k in kinds for f in families]:  # Each kind for both first.
    moe_rows(family, shape, [kind], best.get(family, first), args.steps, peak,
             float("inf") if args.smoke else deadline, add)
  for family in [] if args.no_decode else families:
    if time.time() > deadline and not args.smoke:
      print(f"  (budget spent: {family} decode not run)", flush=True)
      continue
    model_cfg = make_config(family, shape, "none", 1, False).model
    small = dict(batches=(1,), prompt=8, news=(2, 4), repeats=1) if args.smoke else {}
    for row in decode_rows(model_cfg, hbm_bandwidth(dev.device_kind), **small):
      add(row)
  extra = []
  if shape.attention == "cudnn":
    extra.append(("decllm packed, reference attention",
                  dataclasses.replace(shape, attention="reference")))
  for name, s in extra if "decllm" in best and not args.no_packed else []:
    if time.time() > deadline and not args.smoke:
      print(f"  (budget spent: {name} not run)", flush=True)
      continue
    add(packed_row("decllm", name, s, best["decllm"], args.steps, peak))
  if args.profile_dir and not args.no_packed:
    print(f"  DecLLM packed step, GPU kernel ms over 2 steps: {trace_split(args.profile_dir)}")
  print(f"total {time.time() - start:.0f} s; docs/gpus.md row:", flush=True)
  print(table_row(dev.device_kind, jax.__version__, time.strftime("%Y-%m-%d"), rows))
  return rows


if __name__ == "__main__":
  main()
