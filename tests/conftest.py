"""Shared pytest configuration: markers for the slow layers of the suite, the CPU backend, and a
temporary folder of the run's own for every process the tests start.

The suite checks the book's CPU figures, so "auto" means gloo here even on a machine with GPUs
(`make selfcheck` is what runs the lessons on NCCL). The notebooks run by nbval inherit this.

Processes the tests start, and processes they kill on purpose, leave files in the temporary
folder that nothing removes: nbval stops each notebook's kernel without letting it exit, so
multiprocessing's folder for the fork server's socket may stay; each torchrun agent keeps its
logs in a folder of its own; torch keeps a cache folder of its own. The run that
starts first (pytest itself, or the xdist controller) points TMPDIR at a folder of its own,
which every process started later inherits (xdist's workers too), and removes it at the end;
its own files, pytest's tmp_path folders among them, stay in the system's temporary folder. It
keeps the system's folder for all when the run's own would make the path of multiprocessing's
socket too long (LONGEST_TMPDIR).
"""

import os
import shutil
import tempfile

import pytest

os.environ.setdefault("LESSON_CODE_BACKEND", "gloo")

RUN_TMPDIR = "LESSON_CODE_TESTS_TMPDIR"  # set by the run that made the folder, for its workers
# multiprocessing puts the fork server's socket at <TMPDIR>/pymp-XXXXXXXX/listener-XXXXXXXX, and
# a socket's path has at most 104 bytes on macOS (108 on Linux): under a temporary folder whose
# path is longer than this, the tests keep it (their leftovers stay there, as before).
LONGEST_TMPDIR = 104 - len("/pymp-XXXXXXXX/listener-XXXXXXXX") - 1


def pytest_configure(config):
    config.addinivalue_line("markers", "dist: runs real torch.distributed ranks (gloo)")
    if RUN_TMPDIR in os.environ:
        return  # an xdist worker: its controller made the folder
    patch = pytest.MonkeyPatch()  # undone at the end: the environment as it was, for a later run
    patch.setattr(tempfile, "tempdir", tempfile.gettempdir())  # this process keeps the system's
    folder = tempfile.mkdtemp(prefix="lc-tests-")
    if len(os.fsencode(folder)) > LONGEST_TMPDIR:
        os.rmdir(folder)
        patch.undo()
        return
    patch.setenv(RUN_TMPDIR, folder)
    patch.setenv("TMPDIR", folder)
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
    config.add_cleanup(patch.undo)
