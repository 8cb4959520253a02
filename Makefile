# Two commands set everything up on a fresh machine:
#   make quickstart   install, then train + evaluate on the built-in dataset (about a minute on 2 CPU cores)
#   make test         install, then run the test suite
#   make figures      redraw the README's figures (needs the runs of the README's Results table in runs/)
#   make gpu-bundle   prepare .gpu/ for the GPU check (wheels the GPU image lacks, data slices, bf16 MiniLM; docs/gpu.md)
#   make gpu-check    the GPU check on a CUDA machine (no network needed); DRY=1: at tiny sizes on this CPU
# TORCH picks the torch build: the default pin matches the CPU wheel of the reference machine;
# on a GPU machine use e.g. `make test TORCH=torch` to get PyPI's CUDA build.
TORCH ?= torch==2.13.0
PYTHON ?= python3
VENV := .venv

# pip compiles every installed module (65-85 s of a 2.5-minute install): --no-compile saves that only where Python
# writes bytecode as it imports; with PYTHONDONTWRITEBYTECODE=1 (set on the CI machines) every process then compiles
# torch and Lightning anew, and the suite took 37 minutes instead of 20
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q "$(TORCH)" -e ".[dev]"
	touch $@

install: $(VENV)/.installed

quickstart: install
	$(VENV)/bin/trunk fit --config configs/quickstart.yaml

test: install
	$(VENV)/bin/ruff check --quiet .
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=offline $(VENV)/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist worksteal --durations=25

PLOT := $(VENV)/bin/python benchmarks/plot.py
figures: install
	$(PLOT) throughput benchmarks/results/throughput.md benchmarks/figures/throughput.png
	$(PLOT) curves benchmarks/figures/pretraining.png --title "Masked-LM pretraining (configs/pretrain.yaml)" \
		--run "configs/pretrain.yaml=runs/pretrain/csv/version_0/metrics.csv" --metric train/mlm/loss_step val/mlm/ppl
	$(PLOT) curves benchmarks/figures/sst2_scratch_vs_pretrained.png --title "SST-2: from scratch vs fine-tuned" \
		--run "from scratch (configs/sst2.yaml)=runs/sst2/csv/version_0/metrics.csv" \
		--run "from the pretrained trunk (configs/sst2_finetune.yaml)=runs/sst2_finetune/csv/version_0/metrics.csv" \
		--metric val/sst2/acc train/loss
	$(PLOT) curves benchmarks/figures/joint_vs_single.png \
		--title "One trunk for two tasks vs one each (x: optimizer steps; the joint run's are shared)" \
		--run "joint (configs/joint_sst2_conll.yaml)=runs/joint_sst2_conll/csv/version_0/metrics.csv" \
		--run "SST-2 alone=runs/sst2_finetune/csv/version_0/metrics.csv" --run "CoNLL alone=runs/conll2003/csv/version_0/metrics.csv" \
		--metric val/sst2/acc val/conll/f1
	$(PLOT) transfer benchmarks/results/transfer.jsonl benchmarks/figures/transfer_sentiment.png

DATA ?= ../shared/data
GPU_PYTHON ?= 3.12
GPU_OUT ?= gpu-check
gpu-bundle: install
	$(VENV)/bin/python benchmarks/gpu_bundle.py --data $(DATA) --out .gpu --python-version $(GPU_PYTHON)

# On the GPU machine the image's python3 runs it (torch with CUDA there); DRY=1 runs it here, in a fresh environment
ifdef DRY
gpu-check: install
	$(VENV)/bin/python benchmarks/gpu_check.py --dry --out $(GPU_OUT)
else
gpu-check:
	python3 benchmarks/gpu_check.py --bundle .gpu --out $(GPU_OUT)
endif

.PHONY: install quickstart test figures gpu-bundle gpu-check
