# Two commands do all set-up on a fresh machine with Python 3.10-3.12:
#   make demo   train tiny DecLLM and RedLLM on the embedded data, evaluate, compare side by side
#   make test   the test suite (what CI runs)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install demo test test-slow bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m t5like.demo

# Two pytest workers (pytest-xdist): most of a test's time is single-threaded XLA compilation.
test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -n 2 $(PYTEST_ARGS)

# Longer end-to-end checks (marked `slow`), excluded from `make test`.
test-slow: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m slow $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) benchmarks/data_throughput.py
	$(PY) benchmarks/train_throughput.py
	$(PY) benchmarks/decode_throughput.py

clean:
	rm -rf $(VENV) runs .pytest_cache
