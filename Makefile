# Two commands do all set-up on a fresh machine with Python 3.10-3.12:
#   make demo   train tiny DecLLM and RedLLM on the embedded data, evaluate, compare side by side
#   make test   the test suite (what CI runs)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install demo test test-slow test-aot test-gpu bench-gpu test-hf test-harness test-t5 test-beam tpu-table bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m t5like.demo

# Two pytest workers (pytest-xdist): most of a test's time is single-threaded XLA compilation.
# --dist loadscope: a module stays on one worker, so its module-scoped fixtures run once.
test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS)

# Longer end-to-end checks (marked `slow`), excluded from `make test`.
test-slow: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m slow $(PYTEST_ARGS)

# An environment of its own with one more extra of pyproject.toml ($(1): its folder, $(2): the
# extra), for the accelerator stacks that the default environment leaves out.
define extra_venv
$(1)/.installed: pyproject.toml
	test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install --quiet --upgrade pip
	$(1)/bin/python -m pip install --quiet -e '.[test,$(2)]'
	touch $(1)/.installed
endef

# Ahead-of-time TPU compiles (marked `aot`) with libtpu: libtpu is kept out of the default
# environment because on a host without TPUs it logs errors at every JAX start-up.
TPU_VENV ?= .venv-tpu
TPU_PY := $(TPU_VENV)/bin/python
TPU_STAMP := $(TPU_VENV)/.installed
$(eval $(call extra_venv,$(TPU_VENV),tpu))

test-aot: $(TPU_STAMP)
	ALLOW_MULTIPLE_LIBTPU_LOAD=1 $(TPU_PY) -m pytest -q -p no:cacheprovider -m aot $(PYTEST_ARGS)

# On a machine with an NVIDIA GPU (marked `gpu`): cuDNN attention == xla, GPU == CPU, with CUDA
# jax (`.[gpu]`).
GPU_VENV ?= .venv-gpu
GPU_PY := $(GPU_VENV)/bin/python
GPU_STAMP := $(GPU_VENV)/.installed
$(eval $(call extra_venv,$(GPU_VENV),gpu))

test-gpu: $(GPU_STAMP)
	$(GPU_PY) -m pytest -q -p no:cacheprovider -m gpu $(PYTEST_ARGS)

# DecLLM / RedLLM at the paper's 1B widths on one GPU: MFU, tokens/s, memory, packed and not, the
# PyTorch peer when torch + transformers are installed there, decode vs the HBM floor (< 8 min).
bench-gpu: $(GPU_STAMP)
	$(GPU_PY) benchmarks/gpu_train.py $(BENCH_ARGS)

# Exported Hugging Face models (marked `hf`): PyTorch logits and generate() == t5like's, import
# round trips, lm-evaluation-harness on a local task; torch and transformers stay out of `.venv`.
HF_VENV ?= .venv-hf
HF_PY := $(HF_VENV)/bin/python
HF_STAMP := $(HF_VENV)/.installed
$(eval $(call extra_venv,$(HF_VENV),hf))

test-hf: $(HF_STAMP)
	$(HF_PY) -m pytest -q -p no:cacheprovider -m hf $(PYTEST_ARGS)

# lm-evaluation-harness on t5like checkpoints (marked `harness`): lm-eval's core (no torch) in an
# environment of its own, since it would change a package of `.venv` (pyproject.toml).
HARNESS_VENV ?= .venv-harness
HARNESS_PY := $(HARNESS_VENV)/bin/python
HARNESS_STAMP := $(HARNESS_VENV)/.installed
$(eval $(call extra_venv,$(HARNESS_VENV),harness))

test-harness: $(HARNESS_STAMP)
	$(HARNESS_PY) -m pytest -q -p no:cacheprovider -m harness $(PYTEST_ARGS)

# Span corruption against `t5.data.preprocessors` (marked `t5check`): the `t5` package without
# its dependencies (they would replace seqio / tensorflow-datasets with nightlies), plus the
# modules it imports (`[t5check]`), in an environment of its own.
T5_VENV ?= .venv-t5
T5_PY := $(T5_VENV)/bin/python
$(T5_VENV)/.installed: pyproject.toml
	test -x $(T5_PY) || $(PYTHON) -m venv $(T5_VENV)
	$(T5_PY) -m pip install --quiet --upgrade pip
	$(T5_PY) -m pip install --quiet -e '.[test,t5check]'
	$(T5_PY) -m pip install --quiet --no-deps t5==0.9.4
	touch $(T5_VENV)/.installed

test-t5: $(T5_VENV)/.installed
	$(T5_PY) -m pytest -q -p no:cacheprovider -m t5check tests/t5check $(PYTEST_ARGS)

# Corpus caches built on Beam (marked `beam`; t5like/tools/cache_data.py, multi-process
# DirectRunner): apache-beam needs protobuf < 7, hence sentencepiece 0.2.2 (`.[beam]`).
BEAM_VENV ?= .venv-beam
BEAM_PY := $(BEAM_VENV)/bin/python
BEAM_STAMP := $(BEAM_VENV)/.installed
$(eval $(call extra_venv,$(BEAM_VENV),beam))

test-beam: $(BEAM_STAMP)
	$(BEAM_PY) -m pytest -q -p no:cacheprovider -m beam $(PYTEST_ARGS)

# The paper table of docs/pods.md: every paper config compiled for v5p-128 and v5e-256 (a few
# hours on 2 cores; resumes from runs/tpu_table.json).
tpu-table: $(TPU_STAMP)
	ALLOW_MULTIPLE_LIBTPU_LOAD=1 $(TPU_PY) -m t5like.tools.tpu_table --readme docs/pods.md $(TABLE_ARGS)

bench: $(STAMP)
	$(PY) benchmarks/data_throughput.py
	$(PY) benchmarks/train_throughput.py
	$(PY) benchmarks/decode_throughput.py

clean:
	rm -rf $(VENV) $(TPU_VENV) $(HF_VENV) $(HARNESS_VENV) $(T5_VENV) $(BEAM_VENV) runs .pytest_cache
