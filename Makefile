# Two commands set everything up on a fresh machine:
#   make quickstart   install, then train + evaluate on the built-in dataset (about a minute on 2 CPU cores)
#   make test         install, then run the test suite
#   make figures      redraw the README's figures (needs the runs of the README's Results table in runs/)
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
	$(VENV)/bin/ruff check --quiet .
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=offline $(VENV)/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist worksteal

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

.PHONY: install quickstart test figures
