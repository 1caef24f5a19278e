# `make demo` and `make test` each create .venv, install what they need, and run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
# torch==2.13.0 and tensorflow-cpu==2.21.0 are pinned for development and CI.
EXTRAS := dev,torch,tensorflow,ps,mpi,s3,serve,ray

.PHONY: demo test venv clean bench

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	rm -f $(VENV)/.installed-* && touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider --durations=15 tests

bench: $(STAMP)
	$(PY) benchmarks/launch_overhead.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
