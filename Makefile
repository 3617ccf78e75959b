# Two commands set everything up:  make lab  |  make test
# Both create .venv when missing and reinstall only when pyproject.toml changed.

PYTHON     ?= python3
VENV       ?= .venv
BIN        := $(VENV)/bin
# CI sets TORCH_SPEC=torch==2.13.0 (a local CPU wheel); elsewhere pip picks the platform's build.
TORCH_SPEC ?= torch
EXTRAS     ?= test,hf,site
PYTEST_ARGS ?=
# One BLAS/OpenMP thread per process: the tests start kernels beside pytest, and on a
# 2-core machine two threads per process fight each other (measured: 8x slower).
TEST_THREADS ?= 1
NBVAL      := --nbval --nbval-current-env --nbval-sanitize-with tests/sanitize.cfg
# JupyterLab refuses to run as root without this (containers, Colab-like VMs).
ROOT_FLAG  := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: lab test gpu-check exercises bench mutation site clean

$(BIN)/python:
	@$(PYTHON) -c "import sys; sys.exit(0 if sys.version_info >= (3, 10) else 'swkv-teach needs Python >= 3.10; $(PYTHON) is ' + sys.version.split()[0] + ' (try: make PYTHON=python3.11 ...)')"
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed-lab: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install "$(TORCH_SPEC)" -e ".[lab]"
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install "$(TORCH_SPEC)" -e ".[$(EXTRAS)]"
	touch $@ $(VENV)/.installed-lab

# Rooted at the course folder, so the lessons' links to ../exercises/ open; the browser starts in notebooks/.
lab: $(VENV)/.installed-lab
	$(BIN)/jupyter lab $(ROOT_FLAG) --ServerApp.root_dir=. --LabApp.default_url=/lab/tree/notebooks

test: $(VENV)/.installed-test
	OMP_NUM_THREADS=$(TEST_THREADS) $(BIN)/python -m pytest $(NBVAL) tests notebooks solutions $(PYTEST_ARGS)

# The classroom's GPU runtime: the same suite and the exercise grading, forced onto CUDA.
gpu-check: $(VENV)/.installed-test
	@$(BIN)/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu-check: no CUDA GPU is visible to torch (torch ' + torch.__version__ + '); run it on a GPU runtime')"
	SWKV_DEVICE=cuda $(BIN)/python -m pytest $(NBVAL) tests solutions $(PYTEST_ARGS)

exercises: $(VENV)/.installed-lab
	$(BIN)/swkv-teach make-exercises

bench: $(VENV)/.installed-test
	$(BIN)/python -m swkv_teach.bench

# The course as a website in build/site/ (index.html), from the stored notebooks: no kernel starts. Installs only
# the site extra (pinned: Sphinx, myst-nb, the book theme, copybutton, MathJax), not torch. tests/e2e/test_site_browser.py
# builds it too.
site: $(VENV)/.installed-site
	$(BIN)/python site/build_site.py

$(VENV)/.installed-site: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install $$($(BIN)/python site/build_site.py --requirements)
	touch $@

# On demand, not in every CI run (slow: one pytest run per mutant). Plants each mutant of
# tests/mutants/catalogue.py in a temporary copy of the project and reports the kill rate.
MUTATION_ARGS ?=
mutation: $(VENV)/.installed-test
	OMP_NUM_THREADS=$(TEST_THREADS) $(BIN)/python tools/mutation.py $(MUTATION_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
