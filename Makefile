# Two commands set everything up on a fresh machine: `make demo` and `make test`.
# Both first create or refresh the virtual environment .venv from the pinned requirements.lock.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tracemill-installed
# torch is installed first from PyTorch's CPU index as well as PyPI: its build there (2.13.0+cpu) sorts above PyPI's
# (2.13.0, which brings CUDA's libraries); where that index cannot be reached, PyPI's build, which runs on the CPU too.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: demo test lint venv clean

$(STAMP): requirements.lock pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Tracemill needs Python 3.11 or newer (set PYTHON=...)")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --retries 1 --extra-index-url $(TORCH_INDEX) "$$(grep '^torch==' requirements.lock)"
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/tracemill demo

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) tracemill-demo
