# brain-train: `make demo` and `make test` do everything on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# What each kind of use needs installed: the demo the trainer extra, the tests also the dev extra.
TRAINER_STAMP := $(VENV)/.installed-trainer
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: setup demo test lint crd images lock kind-e2e clean distclean

setup: $(DEV_STAMP)

# pyproject.toml's trainer extra admits every supported torch; development pins the newest
# (the CPU build on this disk; requirements/torch-<flavour>.lock pin the same for the image).
TORCH_PIN := torch==2.13.0
$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(TRAINER_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[trainer]' '$(TORCH_PIN)'
	touch $@

# One install of both extras (a fresh `make test` resolves once); the trainer's is then installed too.
$(DEV_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[trainer,dev]' '$(TORCH_PIN)'
	touch $@ $(TRAINER_STAMP)

# Prepares the standard library's sources with a BPE it trains (once), then trains and evaluates
# deploy/examples/local-tokens.yaml on this machine: two local worker pods, CPU, gloo.
# The dataset lands where `braintrain run` mounts the example's data claim (stdlib-tokens).
# Every demo trains from the start in a folder of its own, runs/demo/<time>-XXXX/: its work
# dir and claims (a fresh checkpoint claim), with the data claim linked to the one prepared.
DEMO_CLAIM := stdlib-tokens
DEMO_DATA := runs/claims/$(DEMO_CLAIM)/stdlib
demo: $(TRAINER_STAMP) $(DEMO_DATA)/manifest.json
	@mkdir -p runs/demo
	@run=$$(mktemp -d "runs/demo/$$(date +%Y%m%d-%H%M%S)-XXXX") && mkdir "$$run/claims" && \
		ln -s "../../../claims/$(DEMO_CLAIM)" "$$run/claims/$(DEMO_CLAIM)" && \
		echo "make demo: training in $$run" && \
		$(VENV)/bin/braintrain run deploy/examples/local-tokens.yaml --workdir "$$run/work" --claims "$$run/claims"

$(DEMO_DATA)/manifest.json: $(TRAINER_STAMP)
	$(VENV)/bin/braintrain prepare "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')/*.py" \
		--train-tokenizer --vocab-size 4096 --workers 2 --force --out $(DEMO_DATA)

test: setup
	$(PY) -m pytest -q

# Both images (Dockerfile targets). Name them with TRAINER_IMAGE / OPERATOR_IMAGE;
# TRAINER_BUILD_ARGS picks a CUDA base, e.g. "--build-arg BASE_IMAGE=... --build-arg TORCH_FLAVOUR=cu128".
images:
	docker build --target trainer --tag $(or $(TRAINER_IMAGE),brain-train/trainer:dev) $(TRAINER_BUILD_ARGS) .
	docker build --target operator --tag $(or $(OPERATOR_IMAGE),brain-train/operator:dev) .

# The images' hashed locks, from requirements/*.in; run after changing a dependency. torch-$(TORCH_FLAVOUR).lock
# is torch's build for that flavour (cpu, cu128, ...) from its index at download.pytorch.org, with its dependencies.
TORCH_FLAVOUR ?= cpu
PIP_COMPILE = $(VENV)/bin/pip-compile --quiet --generate-hashes --allow-unsafe --no-strip-extras --no-emit-index-url \
	--no-emit-find-links
lock:
	$(PY) -m pip install --quiet pip-tools
	$(PIP_COMPILE) --output-file=requirements/trainer.lock requirements/trainer.in
	$(PIP_COMPILE) --output-file=requirements/operator.lock requirements/operator.in
	$(PIP_COMPILE) --extra-index-url https://download.pytorch.org/whl/$(TORCH_FLAVOUR) \
		--output-file=requirements/torch-$(TORCH_FLAVOUR).lock requirements/torch-$(TORCH_FLAVOUR).in

# End to end on kind (docker, kind, kubectl, helm): DRY_RUN=1 prints the plan, TEARDOWN=1 deletes the cluster.
kind-e2e:
	DRY_RUN=$(DRY_RUN) TEARDOWN=$(TEARDOWN) bash deploy/kind/e2e.sh

# clean: what runs and tests wrote (the demo's dataset too); distclean: the venv as well.
clean:
	rm -rf runs .pytest_cache

distclean: clean
	rm -rf $(VENV)
