# Two commands set everything up on a fresh machine:
#   make quickstart   install, then train + evaluate on the built-in dataset (about a minute on 2 CPU cores)
#   make test         install, then run the test suite
# TORCH picks the torch build: the default pin matches the CPU wheel of the reference machine;
# on a GPU machine use e.g. `make test TORCH=torch` to get PyPI's CUDA build.
TORCH ?= torch==2.13.0
PYTHON ?= python3
VENV := .venv

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q "$(TORCH)" -e ".[dev]"
	touch $@

install: $(VENV)/.installed

quickstart: install
	$(VENV)/bin/trunk fit --config configs/quickstart.yaml

test: install
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=offline $(VENV)/bin/python -m pytest -q -p no:cacheprovider

.PHONY: install quickstart test
