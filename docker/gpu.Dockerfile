# t5like on NVIDIA GPUs (one image for every host of a multi-node job).
#   docker build -f docker/gpu.Dockerfile -t t5like:gpu .
#   docker run --gpus all --rm -v $PWD/runs:/app/runs t5like:gpu \
#     python train.py --config configs/decllm_150m.py --workdir runs/decllm_150m
# Multi-node: run docker/launch_gpu.sh on every node (it passes the coordinator and process ids).
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
RUN apt-get update && apt-get install -y --no-install-recommends python3.11 python3.11-venv \
      python3-pip git make && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY t5like ./t5like
RUN python3.11 -m venv /opt/venv && /opt/venv/bin/pip install --upgrade pip \
    && /opt/venv/bin/pip install -e '.[gpu,test]'
ENV PATH=/opt/venv/bin:$PATH XLA_PYTHON_CLIENT_MEM_FRACTION=0.92
COPY . .
CMD ["python", "train.py"]
