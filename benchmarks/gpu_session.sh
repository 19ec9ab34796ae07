#!/usr/bin/env bash
# A GPU session's checks and measurements in one go, from the repo root (docs/gpus.md):
#
#   benchmarks/gpu_session.sh [OUT_DIR]          (default: $OUT if set, else runs/gpu_session)
#
# Phases, in the order of what the targets need; each has its own time limit (seconds, env
# overrides), none runs past TOTAL_S (default 570 s) from the start, and one that no longer fits
# is logged in OUT_DIR/skipped.txt (run it in a later session: PHASES="moe_train train_ab" ...):
#   check      the card, driver, JAX version and date (device.txt); every XLA flag variant parses
#   tests      the GPU tests (tests/gpu, marked `gpu`), TEST_S=75
#   decode     greedy decode of DecLLM-1B and RedLLM-1B, batch 1 and 8, against the HBM floor,
#              kernels per token (compiled loop body, and a trace), DECODE_S=130
#   decode_ab  DecLLM-1B batch-1 decode per flag variant, each in a fresh process: command
#              buffers around the while loop / off, DECODE_AB_S=110 (the default arm: decode)
#   ragged     one MoE layer's grouped products: ragged_dot vs a GEMM of the same FLOPs, the
#              capacity path's einsum, Pallas' Mosaic GPU grouped GEMM; default flags and
#              XLA's cuDNN ragged-dot fusion, RAGGED_S=70
#   train      DecLLM-1B and RedLLM-1B train steps (remat dots, unpacked) and the transformers
#              Llama peer, MFU and tokens/s, TRAIN_S=120
#   moe_train  decllm_1b_moe / redllm_1b_moe train steps, capacity (both families) then
#              dropless, MFU on active parameters, MOE_S=150
#   train_ab   DecLLM-1B train steps under the latency-hiding scheduler and without command
#              buffers, TRAIN_AB_S=110 (the default arm: train)
# Everything goes to OUT_DIR: device.txt, <phase>.log, <phase>.json (rows stamped with card, JAX
# version, date and XLA_FLAGS), summary.md (every row in one table). PY picks the interpreter
# (default python3: CUDA JAX, flax, optax; torch + transformers for the peer). SMOKE=1 passes
# --smoke to every benchmark: the whole script in a few minutes on a CPU (its wiring checked).
set -uo pipefail
OUT_DIR=${1:-${OUT:-runs/gpu_session}}
PY=${PY:-python3}
PHASES=${PHASES:-check tests decode decode_ab train ragged moe_train train_ab}
S=$([ "${SMOKE:-0}" = 1 ] && echo --smoke)
SLOW=${SLOW:-$([ "${SMOKE:-0}" = 1 ] && echo 10 || echo 1)}  # Time limits x SLOW (a CPU: 10).
T() { echo $(($1 * SLOW)); }
TOTAL_S=${TOTAL_S:-$(T 570)}
mkdir -p "$OUT_DIR"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# JAX grows its GPU memory as needed (the peer shares the card); a rerun on a warm machine finds
# its compilations cached (keyed by program and XLA_FLAGS, so variants never mix).
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/t5like_jax_cache}
START=$(date +%s)

# run_phase NAME LIMIT_S CMD...: CMD under `timeout`, at most what is left of TOTAL_S.
run_phase() {
  local name=$1 limit=$2; shift 2
  case " $PHASES " in *" $name "*) ;; *) return 0 ;; esac
  local left=$((TOTAL_S - ($(date +%s) - START)))
  if ((left < 30)); then
    echo "== $name: skipped, $left s of TOTAL_S=$TOTAL_S left" | tee -a "$OUT_DIR/skipped.txt"
    return 0
  fi
  ((limit > left)) && limit=$left
  echo "== $name (limit ${limit} s, $(date -u +%H:%M:%S))"
  timeout "$limit" "$@" 2>&1 | tee "$OUT_DIR/$name.log"
  echo "== $name: exit ${PIPESTATUS[0]} after $(($(date +%s) - START)) s in all"
}

check() {
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  $PY -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())"
  $PY -c "import flax, optax, orbax.checkpoint as o
print('flax', flax.__version__, 'optax', optax.__version__, 'orbax', o.__version__)"
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
    || echo "no torch/transformers: no peer row"
  $PY benchmarks/gpu_flags.py --check --variants all
}
case " $PHASES " in  # Under a limit too: a GPU that hangs at start-up fails here, in 90 s.
  *" check "*) timeout "$(T 90)" bash -c "$(declare -f check); PY='$PY' check" 2>&1 |
    tee "$OUT_DIR/device.txt" ;;
esac

TRAIN_ARGS="--remats dots --no_packed --no_decode --steps 3 $S"
run_phase tests "$(T ${TEST_S:-75})" $PY -m pytest -q -p no:cacheprovider -m gpu tests/gpu
run_phase decode "$(T ${DECODE_S:-130})" $PY benchmarks/gpu_decode.py --families decllm,redllm \
  --batches 1,8 --profile_dir /tmp/t5like_decode_profile --json "$OUT_DIR/decode.json" $S
run_phase decode_ab "$(T ${DECODE_AB_S:-110})" $PY benchmarks/gpu_flags.py --bench decode \
  --variants command_buffer_while,no_command_buffer --timeout_s $(T 54) \
  --json "$OUT_DIR/decode_ab.json" $S -- --families decllm --batches 1
run_phase ragged "$(T ${RAGGED_S:-70})" $PY benchmarks/gpu_flags.py \
  --bench benchmarks/gpu_ragged.py --variants default,ragged_dot_cudnn --timeout_s $(T 34) \
  --json "$OUT_DIR/ragged.json" $S
run_phase train "$(T ${TRAIN_S:-120})" $PY benchmarks/gpu_train.py $TRAIN_ARGS --budget_s 80 \
  --families decllm,redllm --json "$OUT_DIR/train.json"
run_phase moe_train "$(T ${MOE_S:-150})" $PY benchmarks/gpu_train.py $TRAIN_ARGS --budget_s 110 \
  --no_dense --no_peer --families decllm,redllm --moe capacity,dropless \
  --json "$OUT_DIR/moe_train.json"
run_phase train_ab "$(T ${TRAIN_AB_S:-110})" $PY benchmarks/gpu_flags.py --bench train \
  --variants latency_hiding,no_command_buffer --timeout_s $(T 54) \
  --json "$OUT_DIR/train_ab.json" -- $TRAIN_ARGS --no_peer --families decllm
$PY benchmarks/gpu_report.py "$OUT_DIR" > "$OUT_DIR/summary.md" 2>&1
cat "$OUT_DIR/summary.md"
echo "total $(($(date +%s) - START)) s"
