# brain-train: `make demo` and `make test` do everything on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# What each kind of use needs installed: the demo the trainer extra, the tests also the dev extra.
TRAINER_STAMP := $(VENV)/.installed-trainer
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: setup demo test lint crd images image-check lock kind-e2e clean distclean

setup: $(DEV_STAMP)

# pyproject.toml's trainer extra admits every supported torch; development pins the newest (the CPU build on
# this disk; requirements/trainer-<flavour>-<arch>.lock pin the same for the image). Without an NVIDIA GPU, torch's
# CPU build from PyTorch's index is preferred to PyPI's CUDA build (2.5 GiB of NVIDIA wheels); where that index
# does not answer within seconds, pip's own index serves (requirements/torch_source.py says which).
TORCH_PIN := torch==2.13.0
TORCH_SOURCE = $$($(PY) requirements/torch_source.py)
SAY_TORCH = $(PY) -c 'import torch; print(f"make setup: installed torch {torch.__version__}")'
$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(TRAINER_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet $(TORCH_SOURCE) -e '.[trainer]' '$(TORCH_PIN)'
	$(SAY_TORCH)
	touch $@

# One install of both extras (a fresh `make test` resolves once); the trainer's is then installed too.
$(DEV_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet $(TORCH_SOURCE) -e '.[trainer,dev]' '$(TORCH_PIN)'
	$(SAY_TORCH)
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

# Both images (Dockerfile targets) with docker, else buildah, else podman (deploy/images/build.sh): name them with
# TRAINER_IMAGE / OPERATOR_IMAGE; TORCH_FLAVOUR=cu130 makes the CUDA trainer.
images:
	bash deploy/images/build.sh

# Builds both images and runs them (deploy/images/check.sh): the trainer trains a few steps as uid 1000 and stops
# on SIGTERM with a checkpoint; the operator answers --help and has no torch. Builds its own Debian base where
# Docker Hub is unreachable.
image-check:
	bash deploy/images/check.sh

# The images' hashed locks from requirements/*.in, for amd64 and arm64 (requirements/lock.sh, uv reads the
# hashes from the indexes: no wheel is downloaded); run after changing a dependency.
lock: | $(PY)
	$(PY) -m pip install --quiet uv
	UV=$(CURDIR)/$(VENV)/bin/uv PYTHON=$(CURDIR)/$(PY) bash requirements/lock.sh

# End to end on kind (docker, kind, kubectl, helm): DRY_RUN=1 prints the plan, TEARDOWN=1 deletes the cluster.
kind-e2e:
	DRY_RUN=$(DRY_RUN) TEARDOWN=$(TEARDOWN) bash deploy/kind/e2e.sh

# clean: what runs and tests wrote (the demo's dataset too); distclean: the venv as well.
clean:
	rm -rf runs .pytest_cache

distclean: clean
	rm -rf $(VENV)
