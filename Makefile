# specstore: audio corpus -> zarr feature store -> length-binned inference.
# Every target installs what it needs first; variables can be set on the command line.

PYTHON      ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
DEMO_CORPUS := data/demo-corpus
CORPUS      ?= $(DEMO_CORPUS)
STORE       ?=
FEATURES    ?= mel,cqt
JOBS        ?= $(shell nproc 2>/dev/null || echo 2)
LAYOUT      ?= raw
BACKEND     ?= loky
SCHEDULER   ?=
MODEL       ?=
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

# STORE and MODEL have no defaults (only `make demo` uses its own fixed paths): a target that needs
# one and lacks it stops at once with one line, before installing or writing anything.
needs = $(foreach v,$(2),$(if $(strip $($(v))),,$(error make $(1) needs $(v)=... (e.g. $(v)=$(if $(filter STORE,$(v)),data/mine.zarr,models/mine.pt)))))
$(foreach t,features plan,$(if $(filter $(t),$(MAKECMDGOALS)),$(call needs,$(t),STORE)))
$(foreach t,infer init-model train eval,$(if $(filter $(t),$(MAKECMDGOALS)),$(call needs,$(t),STORE MODEL)))

# Values are quoted for the shell, so paths may hold spaces (and single quotes).
q = '$(subst ','\'',$(1))'

# torch's OpenMP threads sleep instead of spinning when idle: same speed on a
# quiet machine, up to 10x faster training on a busy one.
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: help install features test test-fast corpus infer plan init-model train eval demo bench

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

features: install  ## CORPUS=dir|manifest.csv STORE=out.zarr (required) FEATURES=mel,cqt JOBS=n LAYOUT=raw|zstd
	@if [ $(call q,$(CORPUS)) = $(call q,$(DEMO_CORPUS)) ]; then $(MAKE) --no-print-directory corpus; fi
	$(PY) -m pipeline.cli $(call q,$(CORPUS)) $(call q,$(STORE)) --features $(call q,$(FEATURES)) \
		--jobs $(call q,$(JOBS)) --layout $(call q,$(LAYOUT)) --backend $(call q,$(BACKEND)) \
		$(if $(SCHEDULER),--scheduler $(call q,$(SCHEDULER)))

infer: install  ## STORE=… MODEL=… (required) OUT=predictions.csv DEVICE=auto|cpu|cuda BUDGET_MB=… TOPK=5
	$(PY) -m infer.cli predict $(call q,$(STORE)) $(call q,$(MODEL)) --out $(call q,$(OUT)) \
		--device $(call q,$(DEVICE)) --topk $(call q,$(TOPK)) --max-batch $(call q,$(MAX_BATCH)) \
		--precision $(call q,$(PRECISION)) $(if $(BUDGET_MB),--budget-mb $(call q,$(BUDGET_MB)))

plan: install  ## print the batch plan for STORE (required; and MODEL if it exists) without running the model
	$(PY) -m infer.cli plan $(call q,$(STORE)) $(if $(MODEL),$(if $(wildcard $(MODEL)),--model $(call q,$(MODEL)))) \
		--device $(call q,$(DEVICE)) --max-batch $(call q,$(MAX_BATCH)) \
		$(if $(BUDGET_MB),--budget-mb $(call q,$(BUDGET_MB)))

init-model: install  ## write an untrained checkpoint for STORE to MODEL (both required; ARCH=cnn|resnet)
	$(PY) -m infer.cli init $(call q,$(STORE)) $(call q,$(MODEL)) --arch $(call q,$(ARCH))

train: install  ## STORE MODEL (required) EPOCHS=30 ARCH=cnn WIDTH=32 CROP=10 (s; 0 = whole clips) LR SEED VAL DEVICE BUDGET_MB
	$(PY) -m infer.cli train $(call q,$(STORE)) $(call q,$(MODEL)) --epochs $(call q,$(EPOCHS)) \
		--arch $(call q,$(ARCH)) --width $(call q,$(WIDTH)) --crop-seconds $(call q,$(CROP)) --lr $(call q,$(LR)) \
		--seed $(call q,$(SEED)) --val-fraction $(call q,$(VAL)) --device $(call q,$(DEVICE)) \
		--precision $(call q,$(PRECISION)) --max-batch $(call q,$(MAX_BATCH)) \
		$(if $(BUDGET_MB),--budget-mb $(call q,$(BUDGET_MB)))

eval: install  ## STORE MODEL (required) OUT_DIR=reports SPLIT=all|val|train: report.json, report.txt, confusion.png
	$(PY) -m infer.cli eval $(call q,$(STORE)) $(call q,$(MODEL)) --out-dir $(call q,$(OUT_DIR)) \
		--split $(call q,$(SPLIT)) --device $(call q,$(DEVICE)) --precision $(call q,$(PRECISION)) \
		--max-batch $(call q,$(MAX_BATCH)) $(if $(BUDGET_MB),--budget-mb $(call q,$(BUDGET_MB)))

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

test: install  ## run the whole test suite (as CI does)
	$(PY) -m pytest -q tests

test-fast: install  ## the inner loop: every test not marked slow (under 90 s on 2 cores)
	$(PY) -m pytest -q -m "not slow" tests
