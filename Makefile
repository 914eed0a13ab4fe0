# Two commands set everything up on a fresh machine: `make demo` and `make test`.
# Both first create or refresh the virtual environment .venv from the pinned requirements.lock.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tracemill-installed

.PHONY: demo test venv clean

$(STAMP): requirements.lock pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Tracemill needs Python 3.11 or newer (set PYTHON=...)")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/tracemill demo

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/pytest

clean:
	rm -rf $(VENV) tracemill-demo.db tracemill-demo.db-wal tracemill-demo.db-shm tracemill-demo.db-tracemill-write.lock tracemill-demo-dataset
