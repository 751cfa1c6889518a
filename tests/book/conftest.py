"""Fixtures for the book tests: build the whole Jupyter Book once per session, as CI does.

The build is `jupyter-book build book -W -n --keep-going` (the command of `make book` and of the
workflow that publishes the book) into a fresh temporary folder; any warning fails it. `make book` runs through jupyter-cache (execute_notebooks: cache: a notebook
runs when its code differs from its stored run); here the build renders the outputs stored in the
notebooks (execute_notebooks: off), because
tests/notebooks has just executed every notebook under nbval and running each lesson twice would
double the suite's time. tests/notebooks/test_stored_outputs.py checks that the stored outputs come
from a complete top-to-bottom run. Set BOOK_EXECUTE=force to execute during this build as well.
Tests that read the HTML take the `book_html` fixture; select them all with `pytest -m book`.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]  # the repository root
SOURCE = ROOT / "book"  # the book's source folder (its notebooks/ links to the lessons)
BUILD_TIMEOUT_S = 3600  # every lesson runs real process groups; 81 alone takes minutes on 2 cores
LOG_TAIL_LINES = 60
PROBLEM = re.compile(r"(WARNING|ERROR|CRITICAL):|Error\b")  # Sphinx warnings, tracebacks
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "book: tests of the Jupyter Book (build, browser rendering, fa/en sync)"
    )


def _jupyter_book() -> str:
    """The jupyter-book executable of the running environment, else the one on PATH."""
    beside_python = Path(sys.executable).with_name("jupyter-book")
    found = str(beside_python) if beside_python.exists() else shutil.which("jupyter-book")
    if found is None:
        pytest.fail('jupyter-book is not installed: pip install -e ".[book,test]"')
    return found


def _failure_report(log: str) -> str:
    """Every warning and error line of a build log, then its last lines, without colours."""
    lines = ANSI.sub("", log).splitlines()
    problems = [ln for ln in lines if PROBLEM.search(ln)]
    return "\n".join(
        ["warnings and errors:", *problems, "", f"last {LOG_TAIL_LINES} lines:"]
        + lines[-LOG_TAIL_LINES:]
    )


def _config_with_execution(folder: Path, mode: str) -> Path:
    """A copy of _config.yml whose execute_notebooks is `mode` ("off", "force", ...)."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    config["execute"]["execute_notebooks"] = mode
    path = folder / "_config.yml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def book_html(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """The HTML folder of one build of the book per test run, shared by pytest-xdist's workers.

    The first worker to need it builds it, under a lock in the run's temporary folder that the
    workers share; the others wait for that build and read the same folder (a failed build fails
    them too, with its log). Without xdist the build goes into this run's own temporary folder.
    """
    if worker_id == "master":
        return _build_book(tmp_path_factory.mktemp("book"))
    shared = tmp_path_factory.getbasetemp().parent  # pytest-of-<user>/pytest-<n>, one per run
    with open(shared / "book.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        out = shared / "book"
        if not (out / "build.log").is_file():
            shutil.rmtree(out, ignore_errors=True)  # a worker that died mid-build left it
            out.mkdir()
            try:
                return _build_book(out)
            finally:
                (out / "build.log").touch()  # what was built, whole or failed, is final
        if not (out / "built").is_file():
            log = (out / "build.log").read_text(encoding="utf-8")
            pytest.fail(f"book build failed (log {out / 'build.log'}):\n{_failure_report(log)}",
                        pytrace=False)
        return out / "_build" / "html"


def _build_book(out: Path) -> Path:
    """Build the book into `out` and return its HTML folder.

    Fails (for every test that uses it, with the log's warnings and tail) when jupyter-book exits
    non-zero. The full log is kept beside the output as build.log; a file `built` marks success.
    """
    config = _config_with_execution(out, os.environ.get("BOOK_EXECUTE", "off"))
    cmd = [_jupyter_book(), "build", str(SOURCE), "-W", "-n", "--keep-going", "--path-output",
           str(out), "--config", str(config)]
    start = time.monotonic()
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
            env={**os.environ, "NO_COLOR": "1"},
        )
    except subprocess.TimeoutExpired as exc:
        # TimeoutExpired carries bytes even with text=True.
        log = b"".join(part or b"" for part in (exc.stdout, exc.stderr)).decode(errors="replace")
        pytest.fail(f"book build ran past {BUILD_TIMEOUT_S} s\n{_failure_report(log)}", pytrace=False)
    log = proc.stdout + proc.stderr
    (out / "build.log").write_text(log, encoding="utf-8")
    if proc.returncode != 0:
        pytest.fail(
            f"book build failed (exit {proc.returncode}, log {out / 'build.log'}):\n"
            + _failure_report(log),
            pytrace=False,
        )
    (out / "built").touch()
    print(f"book built in {time.monotonic() - start:.0f} s into {out}")
    return out / "_build" / "html"
