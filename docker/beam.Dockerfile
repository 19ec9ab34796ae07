# Dataflow worker image for `python -m t5like.tools.cache_data` (docs/data.md): Beam's own SDK
# harness of the release the [beam] extra pins, with t5like and that extra on top, so workers
# import the same seqio, TensorFlow and sentencepiece as the driver. Build and push once:
#   docker build -f docker/beam.Dockerfile -t REGION-docker.pkg.dev/PROJECT/REPO/t5like-beam .
#   docker push REGION-docker.pkg.dev/PROJECT/REPO/t5like-beam
# then pass --sdk_container_image=REGION-docker.pkg.dev/PROJECT/REPO/t5like-beam to cache_data
# (the driver must run the same Python 3.11 and apache-beam 2.77.0: `make test-beam`'s venv).
FROM apache/beam_python3.11_sdk:2.77.0
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md setup.py ./
COPY t5like ./t5like
RUN pip install --upgrade pip && pip install -e '.[beam]'
# The base image's ENTRYPOINT (/opt/apache/beam/boot) starts the worker: keep it.
