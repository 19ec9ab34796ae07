#!/usr/bin/env bash
# Multi-node GPU launch: run on every node with the same COORDINATOR and NUM_NODES, and this
# node's NODE_RANK (0 on the coordinator). Extra arguments go to train.py.
#   COORDINATOR=10.0.0.1:1234 NUM_NODES=2 NODE_RANK=0 docker/launch_gpu.sh \
#     --config configs/decllm_1b.py --workdir /shared/runs/decllm_1b
set -euo pipefail
: "${COORDINATOR:?host:port of node 0}" "${NUM_NODES:?number of nodes}" "${NODE_RANK:?this node}"
exec docker run --gpus all --net=host --rm -v "${RUNS_DIR:-$PWD/runs}:/app/runs" t5like:gpu \
  python train.py \
    --config.distributed.coordinator_address="$COORDINATOR" \
    --config.distributed.num_processes="$NUM_NODES" \
    --config.distributed.process_id="$NODE_RANK" "$@"
