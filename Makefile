# brain-train: `make demo` and `make test` do everything on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint crd images kind-e2e clean

setup: $(STAMP)

# torch==2.13.0 is pinned in pyproject.toml (the CPU build on this disk).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[trainer,dev]'
	touch $(STAMP)

test: setup
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) runs .pytest_cache
