# brain-train: `make demo` and `make test` do everything on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint crd images lock kind-e2e clean

setup: $(STAMP)

# pyproject.toml's trainer extra admits every supported torch; development pins the newest
# (the CPU build on this disk; the Dockerfile's TORCH_VERSION is the same).
TORCH_PIN := torch==2.13.0
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[trainer,dev]' '$(TORCH_PIN)'
	touch $(STAMP)

# Prepares the standard library's sources with a BPE it trains, then trains and evaluates
# deploy/examples/local-tokens.yaml on this machine: two local worker pods, CPU, gloo.
# The dataset lands where `braintrain run` mounts the example's data claim (stdlib-tokens).
DEMO_DATA := runs/claims/stdlib-tokens/stdlib
demo: $(DEMO_DATA)/manifest.json
	$(VENV)/bin/braintrain run deploy/examples/local-tokens.yaml

$(DEMO_DATA)/manifest.json: $(STAMP)
	$(VENV)/bin/braintrain prepare "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')/*.py" \
		--train-tokenizer --vocab-size 4096 --workers 2 --force --out $(DEMO_DATA)

test: setup
	$(PY) -m pytest -q

# Both images (Dockerfile targets). Name them with TRAINER_IMAGE / OPERATOR_IMAGE;
# TRAINER_BUILD_ARGS picks a CUDA base, e.g. "--build-arg BASE_IMAGE=... --build-arg TORCH_INDEX_URL=...".
images:
	docker build --target trainer --tag $(or $(TRAINER_IMAGE),brain-train/trainer:dev) $(TRAINER_BUILD_ARGS) .
	docker build --target operator --tag $(or $(OPERATOR_IMAGE),brain-train/operator:dev) .

# The trainer image's hashed lock (everything but torch, which comes from the index of the base
# image's CUDA version) from requirements/trainer.in; run after changing a dependency.
lock:
	$(PY) -m pip install --quiet pip-tools
	$(VENV)/bin/pip-compile --quiet --generate-hashes --allow-unsafe --no-strip-extras --no-emit-index-url --no-emit-find-links \
		--output-file=requirements/trainer.lock requirements/trainer.in

# End to end on kind (docker, kind, kubectl, helm): DRY_RUN=1 prints the plan, TEARDOWN=1 deletes the cluster.
kind-e2e:
	DRY_RUN=$(DRY_RUN) TEARDOWN=$(TEARDOWN) bash deploy/kind/e2e.sh

clean:
	rm -rf $(VENV) runs .pytest_cache
