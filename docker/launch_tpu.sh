#!/usr/bin/env bash
# Cloud TPU VM / pod: put the image on every worker, then run the same train.py command on all of
# them; JAX discovers the pod itself (distributed.mode=auto).
#   TPU=my-v5p-128 ZONE=us-east5-a docker/launch_tpu.sh --config configs/redllm_8b.py \
#     --workdir gs://BUCKET/runs/redllm_8b --config.data.data_dir=gs://BUCKET/redpajama \
#     --config.data.vocab_path=gs://BUCKET/spm32k.model
# The image:
#   IMAGE=us-docker.pkg.dev/PROJ/REPO/t5like:tpu   every worker pulls it (build and push it once:
#                                                  docker build -f docker/tpu.Dockerfile ...).
#   IMAGE unset                                    this checkout's HEAD (git archive: commit your
#                                                  changes first) is copied to every worker and
#                                                  built there as t5like:tpu.
# Optional: PROJECT (gcloud project), DOCKER (default "sudo docker"), DRY_RUN=1 prints the commands.
set -euo pipefail
: "${TPU:?TPU VM name}" "${ZONE:?zone}"
DOCKER=${DOCKER:-sudo docker}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
gcloud_tpu=(gcloud compute tpus tpu-vm)
where=(--zone "$ZONE" ${PROJECT:+--project "$PROJECT"} --worker=all)

run() {
  if [[ -n "${DRY_RUN:-}" ]]; then printf '%q ' "$@"; echo; else "$@"; fi
}

on_all_workers() {
  run "${gcloud_tpu[@]}" ssh "$TPU" "${where[@]}" --command "$1"
}

if [[ -n "${IMAGE:-}" ]]; then
  on_all_workers "$DOCKER pull $(printf '%q' "$IMAGE")"
  image=$IMAGE
else
  tarball="${TMPDIR:-/tmp}/t5like-$$.tar.gz"
  run git -C "$here" archive --format=tar.gz -o "$tarball" HEAD
  run "${gcloud_tpu[@]}" scp "$tarball" "$TPU:t5like.tar.gz" "${where[@]}"
  on_all_workers "rm -rf t5like && mkdir t5like && tar -xzf t5like.tar.gz -C t5like && \
$DOCKER build -q -f t5like/docker/tpu.Dockerfile -t t5like:tpu t5like"
  image=t5like:tpu
fi
args=$(printf '%q ' "$@")
on_all_workers "$DOCKER run --privileged --net=host --rm $(printf '%q' "$image") python train.py $args"
