# `make demo` and `make test` each create .venv, install what they need, and run.
# `make lint` (ruff + mypy) runs in CI before the tests; `make test-fast` is the
# edit-test loop (unit tests only, under a minute).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | sha1sum | cut -c1-12)
# Exact framework versions for development and CI live in constraints.txt.
EXTRAS := dev,torch,tensorflow,ps,mpi,s3,serve,ray,docs

.PHONY: demo test test-fast lint format venv clean bench bench-env browser sandbox-tools docs docs-serve bytecode

# Instance sandboxes need iproute2 (`ip`, `ss`), util-linux (`setpriv`, `nsenter`), passt
# (`pasta`, the instances' outbound network), a C compiler (`cc`: Ray nodes build the
# bind shim, shipyard/sandbox/bindshim.c) and libseccomp (the seccomp filter): installed when missing, as root with apt-get;
# elsewhere `shipyard doctor` names what is missing (jobs still run, without sandboxes,
# outbound traffic or the shim).
# A busy package manager (another install holds its lock) is waited for up to APT_WAIT
# seconds; then `make demo`/`make test` go on without the tools and say which.
APT_WAIT ?= 300
SANDBOX_TOOLS := ip:iproute2 ss:iproute2 setpriv:util-linux nsenter:util-linux pasta:passt cc:gcc
# libraries (file name:package): libseccomp builds the instances' seccomp filter
SANDBOX_LIBS := libseccomp.so.2:libseccomp2
sandbox-tools:
	@missing=""; for t in $(SANDBOX_TOOLS); do \
	  command -v $${t%%:*} >/dev/null 2>&1 || [ -x /usr/sbin/$${t%%:*} ] || [ -x /sbin/$${t%%:*} ] \
	    || missing="$$missing $${t##*:}"; done; \
	for l in $(SANDBOX_LIBS); do \
	  ls /lib/*/$${l%%:*} /usr/lib/*/$${l%%:*} /lib/$${l%%:*} /usr/lib/$${l%%:*} 2>/dev/null \
	    | grep -q . || missing="$$missing $${l##*:}"; done; \
	if [ -n "$$missing" ]; then \
	  scripts/apt-install "jobs run without instance sandboxes, see shipyard doctor" $(APT_WAIT) $$missing; fi

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[$(EXTRAS)]"
	rm -f $(VENV)/.installed-* && touch $(STAMP)

venv: $(STAMP)

# shipyard's own modules byte-compiled, as pip does for an installed package: an editable
# install under PYTHONDONTWRITEBYTECODE (set on these machines) never writes them, so
# every agent, CLI and job process compiled shipyard again (0.15 s of CPU for the agent's
# and the client's imports; a 4-instance job starts five such processes at once)
bytecode: $(STAMP)
	$(PY) -m compileall -q src >/dev/null

demo: $(STAMP) sandbox-tools bytecode
	$(PY) examples/demo.py

# The dashboard's tests drive Debian's chromium (headless); installed here when missing.
browser:
	@command -v chromium >/dev/null 2>&1 || \
	  scripts/apt-install "the dashboard's browser tests are skipped" $(APT_WAIT) chromium

# The suite on TEST_WORKERS pytest-xdist workers: integration and e2e tests go to a worker a
# module at a time (the Ray backend's package at once), so each shared setup is made once;
# unit tests are spread one by one (tests/conftest.py, xdist_group_of). Measured in
# docs/decisions.md ("make test in parallel"); TEST_WORKERS=0 runs it serially.
TEST_WORKERS ?= 2
test: $(STAMP) sandbox-tools browser bytecode
	$(PY) -m pytest -q -p no:cacheprovider --durations=15 -n $(TEST_WORKERS) --dist loadgroup tests

# The documentation site, strict (a broken link or a reference the code no longer backs fails
# the build), into build/site; its reference pages are generated from the code
# (docs/_hooks/reference.py). tests/integration/docs builds it too, so CI does.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

test-fast: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -x -n 2 tests/unit

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples docs/_hooks
	$(VENV)/bin/ruff format --check src tests benchmarks examples docs/_hooks
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff check --fix src tests benchmarks examples
	$(VENV)/bin/ruff format src tests benchmarks examples

bench: $(STAMP) bytecode
	$(PY) benchmarks/launch_overhead.py

# The serving peers (benchmarks/serving.py) in an environment of their own, over .venv's
# packages (a .pth file), so they never become the product's dependencies.
BENCH_VENV := .venv-bench
TRITON_PYTHON ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12.*/bin/python3.12) $(shell command -v python3.12))
bench-env: $(STAMP)
	test -x $(BENCH_VENV)/bin/python || $(PY) -m venv $(BENCH_VENV)
	$(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" \
		> "$$($(BENCH_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/_project_venv.pth"
	$(BENCH_VENV)/bin/python -m pip install --quiet -c constraints.txt -r benchmarks/requirements-bench.txt
	@# Triton (PyTriton): its model stub needs a Python it supports (3.12 here; 3.11 fails in
	@# the stub), with a TensorFlow of its own for the same model
	@if [ -n "$(TRITON_PYTHON)" ]; then \
		test -x .venv-triton/bin/python || $(TRITON_PYTHON) -m venv .venv-triton; \
		.venv-triton/bin/python -m pip install --quiet -c constraints.txt nvidia-pytriton==0.7.0 tensorflow-cpu; \
	else echo "no Python 3.12 found: the Triton rows of benchmarks/serving.py will say so"; fi
	@echo "now: $(BENCH_VENV)/bin/python benchmarks/serving.py --peers"

clean:
	rm -rf $(VENV) $(BENCH_VENV) .venv-triton build *.egg-info src/*.egg-info
