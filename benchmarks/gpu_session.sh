#!/usr/bin/env bash
# A GPU session's checks in one go (~10 minutes on one H100 / H200), from the repo root:
#
#   benchmarks/gpu_session.sh [OUT_DIR]          (default: runs/gpu_session, or $OUT if set)
#
# 1. the card, driver and JAX version; 2. the GPU tests (tests/gpu, marked `gpu`: cuDNN plain and
# packed attention == xla forward and gradients, MHA and GQA; models and generation GPU == CPU);
# 3. the paper-1B benchmark (benchmarks/gpu_train.py: train MFU packed and unpacked, the PyTorch
# peer, decode vs the HBM floor, a 2-step trace split by kernel class). Each step has its own
# time limit so that a hang in one leaves the others their time; everything is logged to OUT_DIR
# (device.txt, test_gpu.log, bench.log, bench.json). PY picks the interpreter (default python3:
# an environment with CUDA JAX, flax, optax; torch + transformers for the peer); TEST_S and BENCH_S
# the two steps' seconds, BENCH_ARGS more gpu_train.py flags (e.g. --remats none,dots).
set -uo pipefail
OUT_DIR=${1:-${OUT:-runs/gpu_session}}
PY=${PY:-python3}
TEST_S=${TEST_S:-180}
BENCH_S=${BENCH_S:-390}
mkdir -p "$OUT_DIR"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  $PY -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())"
  $PY -c "import flax, optax, orbax.checkpoint as o; print('flax', flax.__version__, 'optax', optax.__version__, 'orbax', o.__version__)"
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
    || echo "no torch/transformers: no peer row"
} 2>&1 | tee "$OUT_DIR/device.txt"
timeout "$TEST_S" $PY -m pytest -q -p no:cacheprovider -m gpu tests/gpu 2>&1 | tee "$OUT_DIR/test_gpu.log"
timeout "$BENCH_S" $PY benchmarks/gpu_train.py --budget_s $((BENCH_S - 120)) \
  --json "$OUT_DIR/bench.json" --profile_dir /tmp/t5like_gpu_profile ${BENCH_ARGS:-} 2>&1 | tee "$OUT_DIR/bench.log"
