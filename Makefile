# Two commands set everything up:  make lab  |  make test
# Both create .venv when missing and reinstall when pyproject.toml or the torch/extras asked for changed.

PYTHON     ?= python3
VENV       ?= .venv
BIN        := $(VENV)/bin
# Which torch pip installs. Nothing set: pip's pick for the platform (on Linux a CUDA build, several GB).
# CI's fast pass sets TORCH_SPEC=torch==2.13.0 (a CPU wheel on the build machines' disk); Colab's is torch==2.11.0.
TORCH_SPEC ?= torch
# Set to PyTorch's CPU wheel index (README: "A CPU-only torch") to install a CPU build of torch first.
TORCH_INDEX ?=
# More requirements installed with the course, e.g. Colab's own versions: PINS="transformers==5.15.0 numpy==2.1.3"
PINS       ?=
EXTRAS     ?= test,hf,site
PYTEST_ARGS ?=
# What `make test` runs: everything, or the files named (CI's Colab pass names the torch-dependent ones).
TESTS      ?= tests notebooks solutions
# One BLAS/OpenMP thread per process: the tests start kernels beside pytest, and on a
# 2-core machine two threads per process fight each other (measured: 8x slower).
TEST_THREADS ?= 1
NBVAL      := --nbval --nbval-current-env --nbval-sanitize-with tests/sanitize.cfg
# JupyterLab refuses to run as root without this (containers, Colab-like VMs).
ROOT_FLAG  := $(if $(filter 0,$(shell id -u)),--allow-root,)
# One stamp per request: asking for another torch, index, pins or extras installs again, in the same venv.
STAMP      := $(shell printf '%s' '$(TORCH_SPEC)|$(TORCH_INDEX)|$(PINS)|$(EXTRAS)' | cksum | cut -d' ' -f1)
TORCH_FIRST := $(if $(TORCH_INDEX),$(BIN)/python -m pip install "$(TORCH_SPEC)" --index-url "$(TORCH_INDEX)",true)

.PHONY: lab test gpu-check exercises bench mutation site clean

$(BIN)/python:
	@$(PYTHON) -c "import sys; sys.exit(0 if sys.version_info >= (3, 10) else 'swkv-teach needs Python >= 3.10; $(PYTHON) is ' + sys.version.split()[0] + ' (try: make PYTHON=python3.11 ...)')"
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed-lab-$(STAMP): pyproject.toml | $(BIN)/python
	$(TORCH_FIRST)
	$(BIN)/python -m pip install "$(TORCH_SPEC)" $(PINS) -e ".[lab]"
	touch $@

$(VENV)/.installed-test-$(STAMP): pyproject.toml | $(BIN)/python
	$(TORCH_FIRST)
	$(BIN)/python -m pip install "$(TORCH_SPEC)" $(PINS) -e ".[$(EXTRAS)]"
	@$(BIN)/python -c "import torch, sys; print('make: torch', torch.__version__, '(CUDA ' + str(torch.version.cuda) + ')', 'on Python', sys.version.split()[0])"
	touch $@ $(VENV)/.installed-lab-$(STAMP)

# Rooted at the course folder, so the lessons' links to ../exercises/ open; the browser starts in notebooks/.
lab: $(VENV)/.installed-lab-$(STAMP)
	$(BIN)/jupyter lab $(ROOT_FLAG) --ServerApp.root_dir=. --LabApp.default_url=/lab/tree/notebooks

test: $(VENV)/.installed-test-$(STAMP)
	OMP_NUM_THREADS=$(TEST_THREADS) $(BIN)/python -m pytest $(NBVAL) $(TESTS) $(PYTEST_ARGS)

# The classroom's GPU runtime: the same suite and the exercise grading, forced onto CUDA.
gpu-check: $(VENV)/.installed-test-$(STAMP)
	@$(BIN)/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu-check: no CUDA GPU is visible to torch (torch ' + torch.__version__ + '); run it on a GPU runtime')"
	SWKV_DEVICE=cuda $(BIN)/python -m pytest $(NBVAL) tests solutions $(PYTEST_ARGS)

exercises: $(VENV)/.installed-lab-$(STAMP)
	$(BIN)/swkv-teach make-exercises

bench: $(VENV)/.installed-test-$(STAMP)
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
mutation: $(VENV)/.installed-test-$(STAMP)
	OMP_NUM_THREADS=$(TEST_THREADS) $(BIN)/python tools/mutation.py $(MUTATION_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
