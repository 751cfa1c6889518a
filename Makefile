# The two commands of the README, each setting itself up from nothing on a machine with make and
# Python 3.11, 3.12, 3.13 or 3.14:
#   make book   creates .venv, installs the pinned dependencies, builds _build/html; a notebook runs
#               when its code differs from the run stored in it (see BOOK below)
#   make test   the whole suite: unit, distributed (real gloo ranks), notebooks (nbval), book build, browser
# and, separately, make selfcheck (each lesson's check on this machine's CPUs or GPUs), make bench
# (figures, not tests), make notebooks (store the listings' code, re-execute, store outputs and
# run times) and make lab (JupyterLab on the repository, opening on the notebooks, with the
# project's kernel and its widgets).
#
# Python: torch 2.13.0 ships wheels for 3.10 to 3.14, but the pinned numpy 2.4, pandas 3.1 and
# matplotlib 3.11 need 3.11 or later, so PYTHON_VERSIONS (pyproject's requires-python, checked
# by tests/unit/test_pins.py) is 3.11 to 3.14. Python 3.11 is the tested one: requirements.lock
# is the environment every figure of the book was measured in, on 3.11; on a newer Python the
# same pins install, but the results have not been re-measured there. So make prefers
# python3.11, then a newer supported python3.X, then python3; PYTHON=/path/to/python chooses.
PYTHON_VERSIONS := 3.11 3.12 3.13 3.14
ifndef PYTHON
# The first that runs (a pyenv shim exists for every installed version, but runs only the active ones).
PYTHON := $(shell for python in $(addprefix python,$(PYTHON_VERSIONS)) python3; do \
	"$$python" -c '' >/dev/null 2>&1 && command -v "$$python" && break; done)
endif
VENV := .venv
BIN := $(VENV)/bin
READY := $(VENV)/.ready
LAB_READY := $(VENV)/.lab-ready
# make lab's Jupyter configuration: JupyterLab's settings for this course, and custom.css, which
# aligns the Persian notebooks' right-to-left prose and styles what jupyterlab-myst draws inside
# it (book/static/jupyterlab-rtl.css). book/static/jupyterlab-settings.json sets JupyterLab's
# defaults (labconfig/default_setting_overrides.json): it never asks to fetch Jupyter's news
# from the internet nor checks for updates; Settings can still change both.
LAB_CONFIG := $(VENV)/jupyter-config
# Extra pip arguments. For a CPU-only torch on a machine whose default index would pick a CUDA
# build, add PyTorch's CPU-only wheel index: PIP_ARGS="--extra-index-url <that index>", with the
# address that PyTorch's installation instructions (the Get Started page on pytorch.org, pip,
# Compute Platform: CPU) give for pip.
PIP_ARGS ?=

.PHONY: book test selfcheck bench notebooks lab clean

$(READY): pyproject.toml requirements.lock
	@test -n "$(PYTHON)" || { echo "make: found no python3.11, python3.1[234] or python3 on PATH:" \
		"install Python 3.11 (the tested one) or pass PYTHON=/path/to/python3.11" >&2; exit 1; }
	@$(PYTHON) -c 'import sys; found = "%d.%d" % sys.version_info[:2]; sys.exit(0 if found in sys.argv[1:] \
		else f"make: $(PYTHON) is Python {sys.version.split()[0]}, but the pinned dependencies need Python" \
		f" $(firstword $(PYTHON_VERSIONS)) to $(lastword $(PYTHON_VERSIONS)): install one (3.11 is the tested one)" \
		" and pass PYTHON=/path/to/it")' $(PYTHON_VERSIONS)
	@echo "make: creating $(VENV) with $(PYTHON) ($$($(PYTHON) --version 2>&1))"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24"
	$(BIN)/python -m pip install --quiet $(PIP_ARGS) -c requirements.lock -e '.[book,test]'
	touch $(READY)

# JupyterLab and its server: only for make lab and the JupyterLab browser test.
$(LAB_READY): $(READY) book/static/jupyterlab-rtl.css book/static/jupyterlab-settings.json
	$(BIN)/python -m pip install --quiet $(PIP_ARGS) -c requirements.lock -e '.[book,test,lab]'
	mkdir -p $(LAB_CONFIG)/custom $(LAB_CONFIG)/labconfig
	cp book/static/jupyterlab-rtl.css $(LAB_CONFIG)/custom/custom.css
	cp book/static/jupyterlab-settings.json $(LAB_CONFIG)/labconfig/default_setting_overrides.json
	touch $(LAB_READY)

# BOOK: `jupyter-book build book`, the command a reader or a CI types, with the CI's strictness
# (-W: a warning, such as a failing cell, fails the build). book/ is the source folder; the
# configuration is _config.yml at the root, which jupyter-book finds above book/ and builds
# beside, into _build/html. execute_notebooks is "cache": a notebook runs only when its code is not
# in _build/.jupyter_cache, and the book's extension (lesson_code.book_build.pages) first puts there
# every notebook whose stored outputs come from `make notebooks` on exactly its current code
# (notebooks/run-times.csv keeps the hash), so a fresh clone builds without running the lessons
# and an edited lesson is run again. The HTML and doctrees are rebuilt from scratch every time, so
# that -W sees the warnings of every page.
book: $(READY)
	rm -rf _build/html _build/.doctrees _build/jupyter_execute
	$(BIN)/jupyter-book build book -W -n --keep-going
	@echo
	@echo "The book is in _build/html: open _build/html/index.html in a browser."

# The suite on one worker per core (pytest-xdist), at least 2 and at most 8, each test sent to
# whichever is free: on 2 cores a single worker leaves a third of the CPU idle (while ranks wait
# on each other, a kernel or a browser starts), and the work is CPU (ranks, kernels, browsers),
# so more cores run more workers. TEST_WORKERS=N chooses; `$(BIN)/python -m pytest tests/...`
# runs any part of it on one. The 25 slowest tests are listed at the end: where the time goes.
TEST_WORKERS ?= $(shell n=$$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2); \
	if [ "$$n" -lt 2 ]; then n=2; elif [ "$$n" -gt 8 ]; then n=8; fi; echo $$n)
test: $(LAB_READY)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal --durations=25

# In Persian with make selfcheck LANG=fa, or on a Persian desktop (LANG=fa_IR.UTF-8).
selfcheck: $(READY)
	$(BIN)/python -m lesson_code.selfcheck $(if $(filter fa%,$(LANG)),--lang fa)

bench: $(READY)
	$(BIN)/python -m lesson_code.bench all

# Stores the current code of lesson_code in every listing cell (the code a lesson shows), then
# executes every notebook in place in its folder, and records in notebooks/run-times.csv how long
# each took, on which machine, when, and the hash of the code it ran (the lesson pages quote the
# time; make book reuses the outputs while the code keeps that hash).
notebooks: $(READY)
	$(BIN)/python -m lesson_code.book_build.listings
	$(BIN)/python -m lesson_code.book_build.run_times notebooks/*/*.ipynb

# JupyterLab on the repository (so lesson_code's files open beside the lessons), opening on
# notebooks/, with this environment's python3 kernel (lesson_code and ipywidgets installed) and
# jupyterlab-myst (the lessons' MyST rendered, not shown as typed), on localhost only, without
# the extension manager's calls to a package index. Stop it with Ctrl+C. First `jupyter trust`
# signs the course's notebooks (their stored outputs show as stored, and the server does not
# call them untrusted); Jupyter's data folder, which holds the signatures and the running
# kernels' files, is $(LAB_DATA), so nothing is written outside the checkout. As root (a
# container), Jupyter refuses to start without --allow-root, so it is passed then.
LAB_DATA := $(LAB_CONFIG)/data
lab: $(LAB_READY)
	JUPYTER_DATA_DIR=$(CURDIR)/$(LAB_DATA) $(BIN)/jupyter trust notebooks/*/*.ipynb
	JUPYTER_CONFIG_DIR=$(CURDIR)/$(LAB_CONFIG) JUPYTER_DATA_DIR=$(CURDIR)/$(LAB_DATA) \
		$(BIN)/jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.root_dir=$(CURDIR) \
		--LabApp.default_url=/lab/tree/notebooks --LabApp.custom_css=True \
		--LabApp.extension_manager=readonly $(if $(filter 0,$(shell id -u)),--allow-root)

clean:
	rm -rf _build bench-results .pytest_cache
