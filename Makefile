# Two commands on a fresh machine: `make demo` and `make test`. Both do all set-up first.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.pretok-installed
DEMO_DIR ?= runs/demo
STUDY_DIR ?= runs/study-quick
# Test processes (pytest-xdist): each test file runs whole on one of them, tests/slurm together (tests/conftest.py).
# Three on two cores: on the slow kind the third fills the time the others wait (SLURM jobs, kernels, children).
# Measured on the Zen 3 stand-in (docs/BENCHMARKS.md): 18.8 min with 3, 21.2 with 2; natively here 13.2-15.2 with 3 (2 runs), 11.9 with 2.
TEST_WORKERS ?= 3
DURATIONS ?= 15
TEST_STAMP := $(shell date -u +%Y%m%dT%H%M%SZ)
TEST_LOG ?= runs/test-logs/$(TEST_STAMP).log

.PHONY: setup sysdeps demo lab test bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e ".[train,notebooks,test,remote,byo,tracking]"
	# megatron-core only to prove our memmap output reads in Megatron-LM unchanged (no deps: torch+numpy suffice).
	$(PIP) install -q --no-deps "megatron-core>=0.12"
	touch $(STAMP)

# The quick study (~11 min on 2 CPU cores): notebooks 01-05 executed, report in $(STUDY_DIR)/report_nocode.html.
# Chromium (PNG figures) is installed first where root and apt-get allow; without it the study writes HTML
# figures only and its last line says how to get the PNGs.
demo: setup
	bash scripts/install_system_deps.sh chromium || echo "make demo: Chromium not installed; continuing (no PNG figures)"
	$(VENV)/bin/pretok study --profile quick --out $(STUDY_DIR)

# JupyterLab on notebooks/ with the project's kernel ("Python (pretok)", this venv) registered, kernels on encrypted
# channels (CurveZMQ, where pyzmq supports it; set in the venv's jupyter_server_config.json).
lab: setup
	$(PY) -m ipykernel install --sys-prefix --name pretok --display-name "Python (pretok)"
	$(PY) -c "from pretok_lib.study.kernels import main; main()"
	$(VENV)/bin/jupyter lab notebooks/

sysdeps:
	bash scripts/install_system_deps.sh

# Bytecode caching on even where the environment turns it off (PYTHONDONTWRITEBYTECODE): the suite starts hundreds
# of Python processes, and each would compile pretok_lib again. The output also goes to $(TEST_LOG), kept after a
# failure (the exit status is pytest's: pipefail).
test: setup sysdeps
	mkdir -p $(dir $(TEST_LOG))
	bash -o pipefail -c 'PYTHONDONTWRITEBYTECODE= HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n $(TEST_WORKERS) \
		--durations=$(DURATIONS) tests 2>&1 | tee $(TEST_LOG)' || { rc=$$?; echo "make test: failed; log: $(TEST_LOG)"; exit $$rc; }
	@echo "make test: log: $(TEST_LOG)"

bench: setup
	$(VENV)/bin/pretok bench tokenize --json runs/bench/tokenize.json

clean:
	rm -rf $(VENV) runs/demo runs/bench $(STUDY_DIR)
