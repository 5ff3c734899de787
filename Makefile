# specstore: audio corpus -> zarr feature store -> length-binned inference.
# Every target installs what it needs first; variables can be set on the command line.
#
# An option goes to a command only when its variable is set: an empty variable means the command's own
# default (`make TARGET ARGS=--help` lists them; run defaults live in infer/options/defaults.py, training defaults in
# infer/train/config.py), so a CONFIG=file.toml is never overridden by a default spelled here.
# ARGS passes more options as they are, word by word to the shell: quote inside it as a shell needs
# (ARGS="--n-mels 64 --hop 256"; JSON belongs in MODEL_ARGS='{"width": 16}', which is quoted for you).

PYTHON      ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
DEMO_CORPUS := data/demo-corpus
CORPUS      ?= $(DEMO_CORPUS)
STORE       ?=
FEATURES    ?=
GROUP_BY    ?=
JOBS        ?=
LAYOUT      ?=
BACKEND     ?=
SCHEDULER   ?=
MAX_IDLE    ?=
MODEL       ?=
OUT         ?=
DEVICE      ?=
BUDGET_MB   ?=
TOPK        ?=
MAX_BATCH   ?=
PRECISION   ?=
TRUST_MODEL_CODE ?=
ARCH        ?=
MODEL_ARGS  ?=
EPOCHS      ?=
WIDTH       ?=
CROP        ?=
LR          ?=
SEED        ?=
VAL         ?=
CONFIG      ?=
ARGS        ?=
OVERWRITE   ?=
OUT_DIR     ?=
SPLIT       ?=
FOLDS       ?=
BASELINES   ?=
BASELINE_STORE ?=
GPU_OUT     ?= reports/gpu-check
# torch: the build that fits this machine (README, "Set up"). TORCH=cpu|cuda chooses; left empty, a CPU wheel of
# TORCH_VERSION that pip's own configuration already offers (a local wheel in find-links, as on CI) is used and no
# other index is asked; else the registry's default (CUDA) build where an NVIDIA GPU answers `nvidia-smi -L`; else
# the CPU build from PyTorch's CPU wheel index. Probed only when .venv is (re)built; TORCH_PIP=... skips the probe.
TORCH       ?=
TORCH_VERSION := 2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
NVIDIA_SMI  ?= nvidia-smi
$(if $(filter-out cpu cuda,$(strip $(TORCH))),$(error TORCH=$(strip $(TORCH)) is not a torch build: use cpu or cuda, \
	or leave it empty to choose by this machine))
torch_offered = $(shell $(PYTHON) -m pip install --dry-run --quiet --no-index --no-deps --ignore-installed \
	'torch==$(TORCH_VERSION)+cpu' >/dev/null 2>&1 && echo yes)
torch_gpu   = $(shell $(NVIDIA_SMI) -L 2>/dev/null | grep -q '^GPU' && echo yes)
torch_local = 'torch==$(TORCH_VERSION)+cpu'
torch_index = --extra-index-url $(TORCH_CPU_INDEX) 'torch==$(TORCH_VERSION)+cpu'
# (=== is exact: a local CPU wheel of the same version, 2.13.0+cpu, would otherwise win over the CUDA build)
torch_cuda  = 'torch===$(TORCH_VERSION)'
TORCH_PIP   ?= $(if $(filter cuda,$(TORCH)),$(torch_cuda),$(if $(torch_offered),$(torch_local),$(if \
	$(filter cpu,$(TORCH)),$(torch_index),$(if $(torch_gpu),$(torch_cuda),$(torch_index)))))
# What `import store, infer` needs that the GPU machine's image lacks (it has torch, numpy, scipy, scikit-learn,
# pytest, fsspec, tqdm, pyyaml, joblib, numba, prometheus-client); the decoder and feature stack that the serving
# step needs (soundfile, soxr, librosa) too; pinned to what `make install` resolves here.
GPU_WHEELS  ?= zarr==3.1.6 numcodecs==0.16.6 donfig==0.8.1.post1 google-crc32c==1.9.0 \
	starlette==1.10.0 uvicorn==0.55.0 python-multipart==0.0.34 httpx==0.29.0 httpcore==1.0.9 anyio==4.16.0 \
	h11==0.16.0 click==8.5.1 idna==3.20 certifi==2026.10.19.post1 \
	soundfile==0.14.0 soxr==1.1.0 librosa==0.11.0 audioread==3.1.0 pooch==1.9.0 platformdirs==4.14.9 \
	decorator==5.3.1 cffi==2.1.1 pycparser==3.12
DEMO_STORE  := data/demo.zarr
DEMO_MODEL  := models/demo.pt
DEMO_TRAIN  := --epochs 15 --width 8 --crop-seconds 5 --crops-per-clip 3 --val-fraction 0.2
REALCORPUS  ?= data/realcorpus
RC_SIZE     ?= full
# Debian packages: the renderer and the tiny test's SoundFont (CI), then every SoundFont of the full corpus.
RC_APT_MIN  := fluidsynth csound-soundfont
RC_APT_ALL  := $(RC_APT_MIN) fluid-soundfont-gm musescore-general-soundfont-small timgm6mb-soundfont
RC_APT      ?= $(RC_APT_MIN)
# Serving: files to classify, where `make serve` listens, and the Debian browser the page's end-to-end test drives.
FILES       ?=
FORMAT      ?=
HOST        ?= 127.0.0.1
PORT        ?= 8000
SERVE_ARGS  ?=
BROWSER_APT := chromium

# STORE and MODEL have no defaults (only `make demo` uses its own fixed paths): a target that needs
# one and lacks it stops at once with one line, before installing or writing anything.
needs = $(foreach v,$(2),$(if $(strip $($(v))),,$(error make $(1) needs $(v)=... (e.g. $(v)=$(if $(filter STORE,$(v)),data/mine.zarr,models/mine.pt)))))
$(foreach t,features plan,$(if $(filter $(t),$(MAKECMDGOALS)),$(call needs,$(t),STORE)))
$(foreach t,infer init-model train eval,$(if $(filter $(t),$(MAKECMDGOALS)),$(call needs,$(t),STORE MODEL)))
$(foreach t,classify serve export,$(if $(filter $(t),$(MAKECMDGOALS)),$(call needs,$(t),MODEL)))
$(if $(filter classify,$(MAKECMDGOALS)),$(if $(strip $(FILES)),,$(error make classify needs FILES=... (audio files and/or folders))))

# Yes/no variables have one rule: empty = unset (the command's own default), 1/yes/true/on = on,
# 0/no/false/off = off (any case); anything else stops make at once with one line, before anything runs.
# flag: its second argument (an option) when the variable its first names is on, nothing otherwise.
BOOLEANS   := TRUST_MODEL_CODE OVERWRITE BASELINES QUICK RESTART
BOOL_ON    := 1 yes true on
BOOL_OFF   := 0 no false off
# (lower-cases the letters the accepted values use; any other capital leaves a value unaccepted, as it should)
lower       = $(subst A,a,$(subst E,e,$(subst F,f,$(subst L,l,$(subst N,n,$(subst O,o,$(subst R,r,$(subst S,s,$(subst \
	T,t,$(subst U,u,$(subst Y,y,$(1))))))))))))
bool_value  = $(call lower,$(strip $($(1))))
bool_bad    = $(if $(bool_value),$(or $(filter-out 1,$(words $(bool_value))),$(filter-out $(BOOL_ON) $(BOOL_OFF),$(bool_value))))
$(foreach v,$(BOOLEANS),$(if $(call bool_bad,$(v)),$(error $(v)=$(strip $($(v))) is not a yes/no value: \
	use 1, yes, true or on; 0, no, false or off; or leave it empty)))
flag        = $(if $(filter $(BOOL_ON),$(call bool_value,$(1))),$(2))

# Values are quoted for the shell, so paths may hold spaces (and single quotes).
q = '$(subst ','\'',$(1))'
# $(call opt,VAR,--flag): "--flag 'value'" when VAR is set, nothing otherwise.
opt = $(if $(strip $($(1))),$(2) $(call q,$($(1))))
# Each command's options, every one only when its variable is set (ARGS last, as given).
RUN_OPTS      = $(call opt,DEVICE,--device) $(call opt,PRECISION,--precision) $(call opt,MAX_BATCH,--max-batch) \
                $(call opt,BUDGET_MB,--budget-mb) $(call flag,TRUST_MODEL_CODE,--trust-model-code)
FEATURES_OPTS = $(strip $(call opt,FEATURES,--features) $(call opt,JOBS,--jobs) $(call opt,GROUP_BY,--group-by) \
                $(call opt,LAYOUT,--layout) \
                $(call opt,BACKEND,--backend) $(call opt,SCHEDULER,--scheduler) $(call opt,MAX_IDLE,--max-idle) \
                $(ARGS))
# make infer and make eval on a cluster (BACKEND=dask|ray; docs/distributed.md).
CLUSTER_OPTS  = $(call opt,BACKEND,--backend) $(call opt,SCHEDULER,--scheduler) \
                $(if $(strip $(BACKEND)),$(call opt,JOBS,--jobs) $(call opt,MAX_IDLE,--max-idle)) \
                $(call flag,RESTART,--restart)
INFER_OPTS    = $(strip $(call opt,OUT,--out) $(call opt,TOPK,--topk) $(RUN_OPTS) $(CLUSTER_OPTS) $(ARGS))
CLASSIFY_OPTS = $(strip $(call opt,TOPK,--topk) $(call opt,JOBS,--jobs) $(RUN_OPTS) $(ARGS))
EXPORT_OPTS   = $(strip $(call opt,FORMAT,--format) $(call opt,OUT,--out) $(call flag,TRUST_MODEL_CODE,--trust-model-code) \
                $(ARGS))
SERVE_OPTS    = $(strip $(call opt,HOST,--host) $(call opt,PORT,--port) $(RUN_OPTS) $(SERVE_ARGS))
PLAN_OPTS     = $(strip $(if $(MODEL),$(if $(wildcard $(MODEL)),--model $(call q,$(MODEL)))) $(RUN_OPTS) $(ARGS))
# The training recipe's options, shared by train and cv (cv trains the same recipe once per fold).
RECIPE_OPTS   = $(call opt,CONFIG,--config) $(call opt,EPOCHS,--epochs) $(call opt,ARCH,--arch) \
                $(call opt,MODEL_ARGS,--model-args) $(call opt,WIDTH,--width) $(call opt,CROP,--crop-seconds) \
                $(call opt,LR,--lr) $(call opt,SEED,--seed)
TRAIN_OPTS    = $(strip $(RECIPE_OPTS) $(call opt,VAL,--val-fraction) $(RUN_OPTS) $(call flag,OVERWRITE,--overwrite) \
                $(ARGS))
# make train NPROC=N: N processes on this machine under torchrun (DistributedDataParallel: gloo on CPU, nccl with
# one GPU per process; docs/distributed.md). No NPROC: one process, as always.
NPROC         ?=
TRAIN_RUN     = $(if $(strip $(NPROC)),$(VENV)/bin/torchrun --standalone --nproc_per_node=$(strip $(NPROC)),$(PY))
CV_OPTS       = $(strip $(RECIPE_OPTS) $(call opt,FOLDS,--folds) $(call opt,OUT_DIR,--out-dir) $(RUN_OPTS) \
                $(call flag,OVERWRITE,--overwrite) $(ARGS))
# ONLY names groups (a value, not a switch): the groups run now replace theirs in the report, the others stay.
BENCH_OPTS    = $(strip $(call flag,QUICK,--quick) $(if $(strip $(ONLY)),--only $(call q,$(ONLY)) --merge))
EVAL_OPTS     = $(strip $(call opt,OUT_DIR,--out-dir) $(call opt,SPLIT,--split) $(RUN_OPTS) \
                $(call flag,BASELINES,--baselines) $(call opt,BASELINE_STORE,--baseline-store) $(CLUSTER_OPTS) $(ARGS))

# torch's OpenMP threads sleep instead of spinning when idle: same speed on a
# quiet machine, up to 10x faster training on a busy one.
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: help install browser-deps classify serve export features test test-fast corpus infer plan init-model train cv eval demo bench realcorpus realcorpus-deps gpu-check gpu-wheels lint

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 16

install: $(VENV)/.installed  ## create .venv with everything pinned; torch 2.13.0 as fits the machine (TORCH=cpu|cuda chooses); prints the line that activates it
	@$(if $(filter install,$(MAKECMDGOALS)),echo ". $(VENV)/bin/activate    # run this in your shell: the specstore commands and the project's python")

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet $(TORCH_PIP)
	$(VENV)/bin/pip install --quiet -e ".[dev]"
	@$(MAKE) --no-print-directory browser-deps || echo "note: no Chromium; the browser test of the upload page will be skipped"
	touch $@

browser-deps:  ## apt-get Debian's Chromium for the upload page's browser test, if missing (Playwright drives it)
	@missing=""; for p in $(BROWSER_APT); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		command -v apt-get >/dev/null || { echo "the browser test needs the Debian packages:$$missing" >&2; exit 1; }; \
		sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
		echo "installing$$missing"; \
		$$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends $$missing; \
	fi

classify: install  ## FILES="a.mp3 dir/" MODEL=…|musicnn-msd (required): top-k genres (a shipped tagger: tags) of audio files, no store (ARGS=--csv|--json)
	$(PY) -m specstore classify $(FILES) --model $(call q,$(MODEL)) $(CLASSIFY_OPTS)

serve: install  ## MODEL=… (required) HOST=127.0.0.1 PORT=8000: upload page + JSON API + /metrics (SERVE_ARGS=--workers 4 …)
	$(PY) -m specstore serve --model $(call q,$(MODEL)) $(SERVE_OPTS)

export: install  ## MODEL=… (required) FORMAT=onnx|torchscript OUT=…: the model as ONNX or TorchScript + a JSON sidecar (docs/export.md)
	$(PY) -m specstore export $(call q,$(MODEL)) $(EXPORT_OPTS)

corpus: install  ## generate the synthetic demo corpus into data/demo-corpus (deterministic)
	@if [ ! -f $(DEMO_CORPUS)/.complete ]; then \
		$(PY) -m specstore demo-corpus $(DEMO_CORPUS) && touch $(DEMO_CORPUS)/.complete; fi

features: install  ## CORPUS=dir|manifest.csv STORE=out.zarr (required) FEATURES=mel,cqt JOBS=n GROUP_BY=parent|REGEX LAYOUT=raw|zstd ARGS=...
	@if [ $(call q,$(CORPUS)) = $(call q,$(DEMO_CORPUS)) ]; then $(MAKE) --no-print-directory corpus; fi
	$(PY) -m specstore features $(call q,$(CORPUS)) $(call q,$(STORE)) $(FEATURES_OPTS)

infer: install  ## STORE=… MODEL=… (required) OUT=predictions.csv DEVICE=auto|cpu|cuda BUDGET_MB=… TOPK=5 TRUST_MODEL_CODE=1 BACKEND=dask|ray SCHEDULER=… JOBS=n MAX_IDLE=… RESTART=1
	$(PY) -m specstore infer $(call q,$(STORE)) $(call q,$(MODEL)) $(INFER_OPTS)

plan: install  ## print the batch plan for STORE (required; and MODEL if it exists) without running the model
	$(PY) -m specstore plan $(call q,$(STORE)) $(PLAN_OPTS)

init-model: install  ## write an untrained checkpoint for STORE to MODEL (both required; ARCH=cnn|resnet)
	$(PY) -m specstore init-model $(call q,$(STORE)) $(call q,$(MODEL)) $(strip $(call opt,ARCH,--arch) $(ARGS))

train: install  ## STORE MODEL (required) EPOCHS ARCH (musicnn: a head on the pretrained backbone) MODEL_ARGS WIDTH CROP (s; 0 = whole) LR SEED VAL CONFIG=f.toml ARGS=... OVERWRITE=1 NPROC=N (torchrun, N processes)
	$(TRAIN_RUN) -m specstore train $(call q,$(STORE)) $(call q,$(MODEL)) $(TRAIN_OPTS)

cv: install  ## STORE (required) FOLDS=5 OUT_DIR=reports/cv + train's options: judge a recipe by grouped k-fold cross-validation on training data
	$(PY) -m specstore cv $(call q,$(STORE)) $(CV_OPTS)

eval: install  ## STORE MODEL (required) OUT_DIR=reports SPLIT=auto|all|val|train BASELINES=1 [BASELINE_STORE=train.zarr] BACKEND=dask|ray SCHEDULER=… JOBS=n RESTART=1
	$(PY) -m specstore eval $(call q,$(STORE)) $(call q,$(MODEL)) $(EVAL_OPTS)

# The demo owns models/demo.pt: one trained under other options (an older version) is replaced; the same run resumes.
demo: install  ## the whole system on the synthetic demo corpus: features, train, predict, evaluate
	@$(MAKE) --no-print-directory features CORPUS=$(DEMO_CORPUS) STORE=$(DEMO_STORE)
	$(PY) -m specstore train $(DEMO_STORE) $(DEMO_MODEL) $(DEMO_TRAIN) --overwrite
	$(PY) -m specstore infer $(DEMO_STORE) $(DEMO_MODEL) --out reports/demo/predictions.csv
	$(PY) -m specstore eval $(DEMO_STORE) $(DEMO_MODEL) --out-dir reports/demo
	@echo
	@echo "demo outputs:"
	@echo "  corpus       $(DEMO_CORPUS)/  (synthetic, one folder per style)"
	@echo "  store        $(DEMO_STORE)   (python -m specstore store info $(DEMO_STORE))"
	@echo "  model        $(DEMO_MODEL)"
	@echo "  predictions  reports/demo/predictions.csv"
	@echo "  report       reports/demo/report.txt, report.json, confusion.png (held-out split)"

bench: install  ## benchmarks side by side -> docs/benchmarks.md, .json (QUICK=1: smoke run; ONLY=model: one group, the others kept)
	$(PY) -m benchmarks $(BENCH_OPTS)

realcorpus-deps:  ## apt-get the renderer + SoundFonts that are missing (RC_APT=...; default: what the tests need)
	@missing=""; for p in $(RC_APT); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		command -v apt-get >/dev/null || { echo "realcorpus needs the Debian packages:$$missing" >&2; exit 1; }; \
		sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
		echo "installing$$missing"; \
		$$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends $$missing; \
	fi

realcorpus: install  ## render the realistic dev corpus (music21 scores, SoundFonts) into REALCORPUS=data/realcorpus; JOBS, RC_SIZE=full|small|tiny; resumable
	@$(MAKE) --no-print-directory realcorpus-deps RC_APT="$(if $(filter tiny,$(RC_SIZE)),$(RC_APT_MIN),$(RC_APT_ALL))"
	@$(PY) -c "import music21" 2>/dev/null || $(VENV)/bin/pip install --quiet -e ".[realcorpus]"
	$(PY) -m specstore realcorpus $(call q,$(REALCORPUS)) --size $(call q,$(RC_SIZE)) $(call opt,JOBS,--jobs)

gpu-check:  ## on a CUDA machine: CUDA tests + GPU figures -> GPU_OUT (no CUDA: says so, exits 0); docs/gpu-check.md
	@if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
		--target /tmp/specstore-site .whl/*.whl >/dev/null && echo "installed the carried wheels (.whl/)"; fi
	PYTHONPATH=/tmp/specstore-site:$$PYTHONPATH $(if $(wildcard $(PY)),$(PY),$(PYTHON)) -m benchmarks.gpu_check \
		--out $(call q,$(GPU_OUT))

gpu-wheels:  ## download the wheels the GPU machine lacks (Python 3.12) into .whl/ for `make gpu-check` there
	@grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		--platform manylinux_2_24_x86_64 --platform manylinux_2_27_x86_64 -d .whl $(GPU_WHEELS)

test: install  ## run the whole test suite (as CI does), in two pytest-xdist processes (about 8 min on 2 cores)
	$(PY) -m pytest -q -n 2 tests

lint: install  ## ruff, mypy and the import contracts (import-linter; pyproject.toml), as CI runs them
	$(VENV)/bin/ruff check --no-cache .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

test-fast: install  ## the inner loop: every test not marked slow, in 2 processes (about 75 s on 2 cores)
	$(PY) -m pytest -q -n 2 -m "not slow" tests
