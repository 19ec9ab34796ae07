#!/usr/bin/env bash
# Several TPU slices joined over the data-center network (multislice): a queued resource of
# NODES slices, the image on every worker of every slice, and the same train.py command on all of
# them, each worker told its slice (the MEGASCALE variables libtpu reads). docs/pods.md
# "Several slices".
#   QR=my-qr ZONE=us-east5-a NODES=2 ACCELERATOR=v5p-128 CREATE=1 \
#     docker/launch_tpu_multislice.sh --config configs/decllm_8b.py \
#     --workdir gs://BUCKET/runs/decllm_8b --config.data.data_dir=gs://BUCKET/redpajama \
#     --config.data.vocab_path=gs://BUCKET/spm32k.model
# Variables:
#   QR, ZONE, NODES        the queued resource, its zone, its number of slices (required)
#   CREATE=1               create the queued resource first (needs ACCELERATOR, e.g. v5p-128 or
#                          v5litepod-256, and RUNTIME, default v2-alpha-tpuv5 / v2-alpha-tpuv5-lite
#                          / v2-alpha-tpuv6e by generation) and wait until it is ACTIVE
#   NODE_PREFIX            the slices' names are NODE_PREFIX-0 ... (default: QR)
#   IMAGE                  as docker/launch_tpu.sh: an image every worker pulls, or unset to build
#                          this checkout's HEAD on every worker
#   MEGASCALE_PORT         the slices' coordinator port (default 8080)
#   PROJECT, DOCKER (default "sudo docker"), DRY_RUN=1 (print the commands, run nothing)
# train.py takes mesh.slices from the devices (0 = auto) and keeps the slices on the mesh's dcn
# axis (data parallelism over DCN); distributed.heartbeat_timeout_s (default 900 s) keeps hosts
# that are compiling from being declared dead.
set -euo pipefail
: "${QR:?queued resource name}" "${ZONE:?zone}" "${NODES:?number of slices}"
DOCKER=${DOCKER:-sudo docker}
PREFIX=${NODE_PREFIX:-$QR}
PORT=${MEGASCALE_PORT:-8080}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
project=(${PROJECT:+--project "$PROJECT"})

run() {
  if [[ -n "${DRY_RUN:-}" ]]; then printf '%q ' "$@"; echo; else "$@"; fi
}

if [[ -n "${CREATE:-}" ]]; then
  : "${ACCELERATOR:?accelerator type of one slice, e.g. v5p-128}"
  case "$ACCELERATOR" in
    v5litepod-*) default_runtime=v2-alpha-tpuv5-lite ;;
    v6e-*) default_runtime=v2-alpha-tpuv6e ;;
    *) default_runtime=v2-alpha-tpuv5 ;;
  esac
  run gcloud compute tpus queued-resources create "$QR" --zone "$ZONE" "${project[@]}" \
    --accelerator-type "$ACCELERATOR" --runtime-version "${RUNTIME:-$default_runtime}" \
    --node-count "$NODES" --node-prefix "$PREFIX"
  until [[ -n "${DRY_RUN:-}" ]] || [[ "$(gcloud compute tpus queued-resources describe "$QR" \
      --zone "$ZONE" "${project[@]}" --format='value(state.state)')" == ACTIVE ]]; do
    echo "waiting for queued resource $QR to become ACTIVE ..."; sleep 60
  done
fi

# Slice 0's first worker coordinates the slices.
if [[ -n "${DRY_RUN:-}" ]]; then
  coordinator=SLICE0_WORKER0_IP
else
  coordinator=$(gcloud compute tpus tpu-vm describe "$PREFIX-0" --zone "$ZONE" "${project[@]}" \
    --format='value(networkEndpoints[0].ipAddress)')
fi

on_slice() {  # on_slice INDEX COMMAND: COMMAND on every worker of slice INDEX.
  run gcloud compute tpus tpu-vm ssh "$PREFIX-$1" --zone "$ZONE" "${project[@]}" --worker=all \
    --command "$2"
}

if [[ -n "${IMAGE:-}" ]]; then
  prepare="$DOCKER pull $(printf '%q' "$IMAGE")"
  image=$IMAGE
else
  tarball="${TMPDIR:-/tmp}/t5like-$$.tar.gz"
  run git -C "$here" archive --format=tar.gz -o "$tarball" HEAD
  for ((i = 0; i < NODES; i++)); do
    run gcloud compute tpus tpu-vm scp "$tarball" "$PREFIX-$i:t5like.tar.gz" --zone "$ZONE" \
      "${project[@]}" --worker=all
  done
  prepare="rm -rf t5like && mkdir t5like && tar -xzf t5like.tar.gz -C t5like && \
$DOCKER build -q -f t5like/docker/tpu.Dockerfile -t t5like:tpu t5like"
  image=t5like:tpu
fi
for ((i = 0; i < NODES; i++)); do  # In parallel (a dry run in order).
  if [[ -n "${DRY_RUN:-}" ]]; then on_slice "$i" "$prepare"; else on_slice "$i" "$prepare" & fi
done
wait

args=$(printf '%q ' "$@")
pids=()
for ((i = 0; i < NODES; i++)); do
  env="-e MEGASCALE_COORDINATOR_ADDRESS=$coordinator:$PORT -e MEGASCALE_NUM_SLICES=$NODES \
-e MEGASCALE_SLICE_ID=$i -e MEGASCALE_PORT=$PORT"
  cmd="$DOCKER run --privileged --net=host --rm $env $(printf '%q' "$image") python train.py $args"
  if [[ -n "${DRY_RUN:-}" ]]; then on_slice "$i" "$cmd"; continue; fi
  on_slice "$i" "$cmd" &
  pids+=($!)
done
status=0
for pid in "${pids[@]+"${pids[@]}"}"; do wait "$pid" || status=$?; done
exit $status
