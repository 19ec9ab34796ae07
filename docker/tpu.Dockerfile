# t5like on Cloud TPU VMs (v4/v5e/v5p/v6e). Build once, run the same command on every worker:
#   docker build -f docker/tpu.Dockerfile -t t5like:tpu .
#   gcloud compute tpus tpu-vm ssh $TPU --worker=all --command \
#     "docker run --privileged --net=host --rm -v /tmp/runs:/app/runs t5like:tpu \
#      python train.py --config configs/redllm_1b.py --workdir gs://BUCKET/runs/redllm_1b"
# On TPU pods jax.distributed.initialize() auto-detects the hosts (see docker/launch_tpu.sh).
FROM python:3.11-slim
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
RUN apt-get update && apt-get install -y --no-install-recommends git make \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY t5like ./t5like
RUN pip install --upgrade pip && pip install -e '.[tpu,test]'
COPY . .
CMD ["python", "train.py"]
