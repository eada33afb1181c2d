# icml26 — the two commands are `make reproduce` and `make test`; both set up .venv when needed.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.icml26-installed
# Debian packages some papers need (audio_watermark: speech corpus, resampling, MP3 attack).
SYSTEM_PACKAGES := espeak-ng sox lame
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export OMP_NUM_THREADS ?= 1
export FLWR_DISABLE_UPDATE_CHECK := 1

.PHONY: install test reproduce report lint bench system-deps torch clean help

help:
	@echo "make reproduce   every implemented paper's quick reproduction, one table (writes results/, README tables)"
	@echo "make test        the test suite (not the slow tier) and 'icml26 report --check'"
	@echo "make lint | bench | report | clean"

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -qq --upgrade "pip>=25.1"

# PyTorch's CPU wheels: a plain `pip install torch` takes the CUDA build (several GB) on Linux x86-64.
TORCH_VERSION   ?= 2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

# Re-install only when pyproject.toml changed (the stamp is older than it).
$(STAMP): pyproject.toml | $(PY)
	@$(MAKE) --no-print-directory system-deps
	@$(MAKE) --no-print-directory torch
	$(PIP) install -qq -e ".[all]" --group dev
	@touch $(STAMP)

# The CPU build: a "+cpu" wheel pip already has locally (its find-links), else PyTorch's CPU index when it
# answers, else a plain install with a warning that it may be a CUDA build. `icml26 info SLUG` says which.
torch: | $(PY)
	@probe=$(VENV)/.torch-probe; rm -rf $$probe; \
	if $(PIP) download -qq --no-deps --no-index -d $$probe torch==$(TORCH_VERSION) 2>/dev/null \
	   && ls $$probe | grep -q '+cpu'; then $(PIP) install -qq torch==$(TORCH_VERSION); \
	elif $(PIP) install -qq --timeout 10 --retries 0 --index-url $(TORCH_CPU_INDEX) torch==$(TORCH_VERSION) 2>/dev/null; then :; \
	else echo "warning: PyTorch's CPU index did not answer; installing torch==$(TORCH_VERSION) from the default index, which may be a CUDA build (set TORCH_CPU_INDEX to a reachable mirror)"; \
	     $(PIP) install -qq torch==$(TORCH_VERSION); fi; rm -rf $$probe

install: $(STAMP)

# Installs the Debian packages when this user can (root with apt-get); otherwise says what is missing.
# Never fails: the code that needs a package raises a clear error naming it.
system-deps:
	@missing=""; for p in $(SYSTEM_PACKAGES); do command -v $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing Debian packages:$$missing"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null) \
	    || echo "warning: could not install$$missing; papers that need them will say so"; \
	else echo "note: Debian packages missing:$$missing (apt-get install -y$$missing); papers that need them will say so"; fi

# One pytest worker per core this process may use (pytest-xdist; each worker keeps one torch thread,
# OMP_NUM_THREADS above), at most 4 (a worker holds up to about 1 GB); the tests are split evenly, and a worker
# that runs out takes queued tests from another (--dist worksteal). `nproc` is not used: it reads OMP_NUM_THREADS.
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(max(1, min(4, len(os.sched_getaffinity(0)))))" 2>/dev/null || echo 2)

test: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal
	$(VENV)/bin/icml26 report --check

reproduce: $(STAMP)
	$(VENV)/bin/icml26 reproduce --all --mode quick --out results
	$(VENV)/bin/icml26 report

report: $(STAMP)
	$(VENV)/bin/icml26 report

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks

bench: $(STAMP)
	@set -e; for b in benchmarks/*.py; do [ -e "$$b" ] || continue; echo "== $$b"; $(PY) "$$b"; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
