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

.PHONY: help install features test corpus clean-store

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

test: install  ## run the test suite
	$(PY) -m pytest -q tests
