#!/usr/bin/env bash
# Cloud TPU VM / pod launch: the same command on every worker; JAX discovers the pod itself.
#   TPU=my-v5p-64 ZONE=us-east5-a docker/launch_tpu.sh --config configs/redllm_8b.py \
#     --workdir gs://BUCKET/runs/redllm_8b
set -euo pipefail
: "${TPU:?TPU VM name}" "${ZONE:?zone}"
args=$(printf '%q ' "$@")
exec gcloud compute tpus tpu-vm ssh "$TPU" --zone "$ZONE" --worker=all --command \
  "docker run --privileged --net=host --rm t5like:tpu python train.py $args"
