# specstore: audio corpus -> zarr feature store -> length-binned inference.
# Every target installs what it needs first; variables can be set on the command line.

PYTHON      ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
DEMO_CORPUS := data/demo-corpus
CORPUS      ?= $(DEMO_CORPUS)
STORE       ?= data/demo.zarr
FEATURES    ?= mel,cqt
JOBS        ?= $(shell nproc 2>/dev/null || echo 2)
LAYOUT      ?= raw
BACKEND     ?= loky
SCHEDULER   ?=
MODEL       ?= models/demo.pt
OUT         ?= predictions.csv
DEVICE      ?= auto
BUDGET_MB   ?=
TOPK        ?= 5
MAX_BATCH   ?= 16
PRECISION   ?= auto
ARCH        ?= cnn
EPOCHS      ?= 30
WIDTH       ?= 32
CROP        ?= 10
LR          ?= 0.003
SEED        ?= 0
VAL         ?= 0.2
OUT_DIR     ?= reports
SPLIT       ?= all
DEMO_STORE  := data/demo.zarr
DEMO_MODEL  := models/demo.pt
DEMO_TRAIN  := --epochs 15 --width 8 --crop-seconds 5
REALCORPUS  ?= data/realcorpus
RC_SIZE     ?= full
# Debian packages: the renderer and the tiny test's SoundFont (CI), then every SoundFont of the full corpus.
RC_APT_MIN  := fluidsynth csound-soundfont
RC_APT_ALL  := $(RC_APT_MIN) fluid-soundfont-gm musescore-general-soundfont-small timgm6mb-soundfont
RC_APT      ?= $(RC_APT_MIN)

# torch's OpenMP threads sleep instead of spinning when idle: same speed on a
# quiet machine, up to 10x faster training on a busy one.
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: help install features test test-fast corpus infer plan init-model train eval demo bench realcorpus realcorpus-deps

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 16

install: $(VENV)/.installed  ## create .venv with everything pinned (torch 2.13.0 CPU)

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet torch==2.13.0
	$(VENV)/bin/pip install --quiet -e ".[dev]"
	touch $@

corpus: install  ## generate the synthetic demo corpus into data/demo-corpus (deterministic)
	@if [ ! -f $(DEMO_CORPUS)/.complete ]; then \
		$(PY) -m democorpus $(DEMO_CORPUS) && touch $(DEMO_CORPUS)/.complete; fi

features: install  ## CORPUS=dir|manifest.csv STORE=out.zarr FEATURES=mel,cqt JOBS=n LAYOUT=raw|zstd
	@if [ "$(CORPUS)" = "$(DEMO_CORPUS)" ]; then $(MAKE) --no-print-directory corpus; fi
	$(PY) -m pipeline.cli $(CORPUS) $(STORE) --features $(FEATURES) --jobs $(JOBS) --layout $(LAYOUT) \
		--backend $(BACKEND) $(if $(SCHEDULER),--scheduler $(SCHEDULER))

infer: install  ## STORE=… MODEL=… OUT=predictions.csv DEVICE=auto|cpu|cuda BUDGET_MB=… TOPK=5
	$(PY) -m infer.cli predict $(STORE) $(MODEL) --out $(OUT) --device $(DEVICE) --topk $(TOPK) \
		--max-batch $(MAX_BATCH) --precision $(PRECISION) $(if $(BUDGET_MB),--budget-mb $(BUDGET_MB))

plan: install  ## print the batch plan for STORE (and MODEL if it exists) without running the model
	$(PY) -m infer.cli plan $(STORE) $(if $(wildcard $(MODEL)),--model $(MODEL)) --device $(DEVICE) \
		--max-batch $(MAX_BATCH) $(if $(BUDGET_MB),--budget-mb $(BUDGET_MB))

init-model: install  ## write an untrained checkpoint for STORE to MODEL (ARCH=cnn|resnet)
	$(PY) -m infer.cli init $(STORE) $(MODEL) --arch $(ARCH)

train: install  ## STORE MODEL EPOCHS=30 ARCH=cnn WIDTH=32 CROP=10 (s; 0 = whole clips) LR SEED VAL DEVICE BUDGET_MB
	$(PY) -m infer.cli train $(STORE) $(MODEL) --epochs $(EPOCHS) --arch $(ARCH) --width $(WIDTH) \
		--crop-seconds $(CROP) --lr $(LR) --seed $(SEED) --val-fraction $(VAL) --device $(DEVICE) \
		--precision $(PRECISION) --max-batch $(MAX_BATCH) $(if $(BUDGET_MB),--budget-mb $(BUDGET_MB))

eval: install  ## STORE MODEL OUT_DIR=reports SPLIT=all|val|train: report.json, report.txt, confusion.png
	$(PY) -m infer.cli eval $(STORE) $(MODEL) --out-dir $(OUT_DIR) --split $(SPLIT) --device $(DEVICE) \
		--precision $(PRECISION) --max-batch $(MAX_BATCH) $(if $(BUDGET_MB),--budget-mb $(BUDGET_MB))

demo: install  ## the whole system on the synthetic demo corpus: features, train, predict, evaluate
	@$(MAKE) --no-print-directory features CORPUS=$(DEMO_CORPUS) STORE=$(DEMO_STORE)
	$(PY) -m infer.cli train $(DEMO_STORE) $(DEMO_MODEL) $(DEMO_TRAIN)
	$(PY) -m infer.cli predict $(DEMO_STORE) $(DEMO_MODEL) --out reports/demo/predictions.csv
	$(PY) -m infer.cli eval $(DEMO_STORE) $(DEMO_MODEL) --split val --out-dir reports/demo
	@echo
	@echo "demo outputs:"
	@echo "  corpus       $(DEMO_CORPUS)/  (synthetic, one folder per style)"
	@echo "  store        $(DEMO_STORE)   (python -m store info $(DEMO_STORE))"
	@echo "  model        $(DEMO_MODEL)"
	@echo "  predictions  reports/demo/predictions.csv"
	@echo "  report       reports/demo/report.txt, report.json, confusion.png (held-out split)"

bench: install  ## benchmarks side by side -> docs/benchmarks.md, .json (QUICK=1: smoke run)
	$(PY) -m benchmarks $(if $(QUICK),--quick)

realcorpus-deps:  ## apt-get the renderer + SoundFonts that are missing (RC_APT=...; default: what the tests need)
	@missing=""; for p in $(RC_APT); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		command -v apt-get >/dev/null || { echo "realcorpus needs the Debian packages:$$missing" >&2; exit 1; }; \
		sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
		echo "installing$$missing"; \
		$$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends $$missing; \
	fi

realcorpus: install  ## render the realistic dev corpus (music21 scores, SoundFonts) into REALCORPUS=data/realcorpus; JOBS, RC_SIZE=full|tiny; resumable
	@$(MAKE) --no-print-directory realcorpus-deps RC_APT="$(if $(filter tiny,$(RC_SIZE)),$(RC_APT_MIN),$(RC_APT_ALL))"
	@$(PY) -c "import music21" 2>/dev/null || $(VENV)/bin/pip install --quiet -e ".[realcorpus]"
	$(PY) -m realcorpus $(REALCORPUS) --size $(RC_SIZE) --jobs $(JOBS)

test: install  ## run the whole test suite (as CI does)
	$(PY) -m pytest -q tests

test-fast: install  ## the inner loop: every test not marked slow (under 90 s on 2 cores)
	$(PY) -m pytest -q -m "not slow" tests
