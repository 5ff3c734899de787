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

.PHONY: help install features test corpus infer plan init-model

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
		$(PY) -m pipeline.demo_corpus $(DEMO_CORPUS) && touch $(DEMO_CORPUS)/.complete; fi

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

test: install  ## run the test suite
	$(PY) -m pytest -q tests
