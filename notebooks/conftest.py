"""pytest settings for the lesson notebooks: `pytest --nbval notebooks/` works as typed.

- Outputs that change from run to run are normalised by nbval-sanitize.cfg (each rule says what
  it replaces) unless another file is passed with --nbval-sanitize-with.
- The notebooks' stored outputs are CPU figures (gloo ranks), so "auto" means gloo here even on
  a machine with GPUs, as in the test suite (tests/conftest.py); `make selfcheck` runs the
  lessons on NCCL.
"""

import os
from pathlib import Path

os.environ.setdefault("LESSON_CODE_BACKEND", "gloo")
SANITIZE = Path(__file__).with_name("nbval-sanitize.cfg")


def pytest_configure(config):
    if getattr(config.option, "nbval_sanitize_with", "missing") is None:
        config.option.nbval_sanitize_with = str(SANITIZE)
