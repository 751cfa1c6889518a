"""Keep the fork server that starts the ranks in step with the code on disk (lessons 76-81).

`launch.spawn` forks every rank from one server process that imported torch, the caller's course
modules and the rank function's module once, when it started (so a run starts in a fraction of a
second). Ranks forked from it run the code it imported: an edit to the package made in a running
Jupyter kernel would never reach them. So when the server starts, the size and modification time
of every source file of the packages it imported is recorded; before each run they are compared
with the files on disk, and a server whose files changed is stopped, so that multiprocessing
starts a fresh one that imports the new code. The caller hands the server its sys.path and the
modules to import in two environment variables, set only while the server starts, which
`lesson_code.runtime.server_imports` reads in the server. Standard library only.
"""

from __future__ import annotations

import json
import os
import sys
from multiprocessing import forkserver

# The record of what a fork server preloaded is kept on multiprocessing's own server object, as
# (server process id, fingerprint): it lives and dies with the server it describes.
RECORD = "lesson_code_preloaded_sources"
# What the caller hands the starting server (JSON lists): its sys.path, and the modules to import.
PATH_VARIABLE = "LESSON_CODE_SERVER_SYS_PATH"
MODULES_VARIABLE = "LESSON_CODE_SERVER_MODULES"


def restart_if_stale(modules: list[str]) -> None:
    """Make sure the fork server runs, first stopping one whose imported sources changed; a
    server started here imports `modules` (through `lesson_code.runtime.server_imports`), which
    the caller hands over in the environment it starts with (`handover`).

    Call only while no rank process is running (`spawn` never leaves one), from one thread at a
    time. Uses multiprocessing's own server object; where its interface differs (another
    Python), nothing is checked.
    """
    server = getattr(forkserver, "_forkserver", None)
    if server is None or not hasattr(server, "_stop") or not hasattr(server, "_forkserver_pid"):
        return
    pid, recorded = getattr(server, RECORD, (None, None))
    if pid == server._forkserver_pid and recorded is not None \
            and source_fingerprint(list(recorded)) != recorded:
        server._stop()
    server.ensure_running()
    if getattr(server, RECORD, (None, None))[0] != server._forkserver_pid:
        setattr(server, RECORD,
                (server._forkserver_pid, source_fingerprint(package_sources(modules))))


def handover(modules: list[str]) -> dict[str, str]:
    """PATH_VARIABLE and MODULES_VARIABLE for a server that starts now, to set in the caller's
    environment only while it starts (`processes.child_environment`).

    The server takes the caller's sys.path from them: multiprocessing hands it over too, but
    Python 3.11, 3.12 before 3.12.8 and 3.13.0 ignore it (CPython issue 117378), and a module
    found only through it (a test's, one in a script's folder) would be imported by each rank.
    """
    path = [os.fspath(entry) for entry in sys.path if isinstance(entry, (str, os.PathLike))]
    return {PATH_VARIABLE: json.dumps(path), MODULES_VARIABLE: json.dumps(modules)}


def package_sources(module_names: list[str]) -> list[str]:
    """The .py files of the top-level packages of `module_names` (torch's excepted), and of
    the folder of each that is a single file.

    A server that preloads `lesson_code.collectives` has also imported what that module imports
    from its package, so the whole package is watched, not only the one file; a module that is
    one file (a test's, a script) may import the files beside it, so they are watched too.
    """
    files: set[str] = set()
    for top_name in sorted({name.split(".")[0] for name in module_names}):
        top = sys.modules.get(top_name)
        if top is None or top.__name__ == "torch":
            continue
        for folder in getattr(top, "__path__", []):
            for root, _, names in os.walk(folder):
                files.update(os.path.join(root, n) for n in names if n.endswith(".py"))
        path = getattr(top, "__file__", None)
        if not hasattr(top, "__path__") and path and os.path.isfile(path):
            folder = os.path.dirname(os.path.abspath(path))
            files.update(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".py"))
    return sorted(files)


def source_fingerprint(paths: list[str]) -> dict[str, tuple[int, int]]:
    """(modification time in ns, size) of each file; a file gone since reads as (0, -1)."""
    fingerprint = {}
    for path in paths:
        try:
            status = os.stat(path)
            fingerprint[path] = (status.st_mtime_ns, status.st_size)
        except OSError:
            fingerprint[path] = (0, -1)
    return fingerprint
