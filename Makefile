# The two commands of the README, each setting itself up from nothing on a machine with Python 3.11:
#   make book   creates .venv, installs the pinned dependencies, executes every notebook, builds _build/html
#   make test   the whole suite: unit, distributed (real gloo ranks), notebooks (nbval), book build, browser
# and, separately, make bench (figures, not tests) and make notebooks (re-execute, store outputs).

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
READY := $(VENV)/.ready
# Extra pip arguments, e.g. PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu" for a
# CPU-only torch on a machine whose default index would pick a CUDA build.
PIP_ARGS ?=

.PHONY: book test bench notebooks clean

$(READY): pyproject.toml requirements.lock
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "Python 3.11 is required, found " + sys.version.split()[0]'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24"
	$(BIN)/python -m pip install --quiet $(PIP_ARGS) -c requirements.lock -e '.[book,test]'
	touch $(READY)

book: $(READY)
	rm -rf _build
	$(BIN)/jupyter-book build . -W -n --keep-going
	@echo
	@echo "The book is in _build/html: open _build/html/index.html in a browser."

test: $(READY)
	$(BIN)/python -m pytest

bench: $(READY)
	$(BIN)/python -m lesson_code.bench all

notebooks: $(READY)
	for notebook in notebooks/*/*.ipynb; do \
		(cd $$(dirname $$notebook) && ../../$(BIN)/jupyter execute --inplace $$(basename $$notebook)) || exit 1; \
	done

clean:
	rm -rf _build bench-results .pytest_cache
