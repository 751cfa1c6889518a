"""pytest settings for the lesson notebooks: `pytest --nbval notebooks/` works as typed.

- Outputs that change from run to run are normalised by nbval-sanitize.cfg (each rule says what
  it replaces) unless another file is passed with --nbval-sanitize-with.
- The notebooks' stored outputs are CPU figures (gloo ranks), so "auto" means gloo here even on
  a machine with GPUs, as in the test suite (tests/conftest.py); `make selfcheck` runs the
  lessons on NCCL.
- Each notebook nbval collects also gets an item `listings`, which fails while a listing cell
  (the code of lesson_code a lesson shows) differs from the current code or names an object
  that does not exist: nbval runs only code cells, and a stale listing would pass it unseen.
  `python -m lesson_code.book_build.listings` stores the current code.
"""

import os
from pathlib import Path

import pytest

os.environ.setdefault("LESSON_CODE_BACKEND", "gloo")
SANITIZE = Path(__file__).with_name("nbval-sanitize.cfg")


def pytest_configure(config):
    if getattr(config.option, "nbval_sanitize_with", "missing") is None:
        config.option.nbval_sanitize_with = str(SANITIZE)


def pytest_collect_file(file_path, parent):
    option = parent.config.option
    if file_path.suffix == ".ipynb" and (getattr(option, "nbval", False)
                                         or getattr(option, "nbval_lax", False)):
        return NotebookListings.from_parent(parent, path=file_path)
    return None


class NotebookListings(pytest.File):
    """A notebook's listing cells, as one item beside nbval's cells."""

    def collect(self):
        yield ListingsItem.from_parent(self, name="listings")


class ListingsItem(pytest.Item):
    def runtest(self):
        import nbformat

        from lesson_code.book_build import listings

        stale = listings.stale_listings(nbformat.read(self.path, as_version=nbformat.NO_CONVERT))
        if stale:
            raise StaleListings(stale)

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, StaleListings):
            return "\n".join([*excinfo.value.args[0], "store the current code with: "
                              "python -m lesson_code.book_build.listings"])
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"{self.path.name}: listings"


class StaleListings(Exception):
    """The listing cells of a notebook that are not the current code."""
