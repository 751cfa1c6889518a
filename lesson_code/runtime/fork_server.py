"""Keep the fork server that starts the ranks in step with the code on disk (lessons 76-81).

`launch.spawn` forks every rank from one server process that imported torch and the rank
function's package once (so a run starts in a fraction of a second). Ranks forked from it run the
code it imported: an edit to the package made in a running Jupyter kernel would never reach them.
So when the server starts, the size and modification time of every source file of the packages it
preloads is recorded; before each run they are compared with the files on disk, and a server
whose files changed is stopped, so that multiprocessing starts a fresh one that imports the new
code. Standard library only.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from multiprocessing import forkserver
from typing import Iterator

# The record of what a fork server preloaded is kept on multiprocessing's own server object, as
# (server process id, fingerprint): it lives and dies with the server it describes.
RECORD = "lesson_code_preloaded_sources"


def restart_if_stale(preload: list[str]) -> None:
    """Start the fork server with `preload`, first stopping one whose preloaded sources changed.

    Call only while no rank process is running (`spawn` never leaves one). Uses multiprocessing's
    own server object; where its interface differs (another Python), nothing is checked.
    """
    server = getattr(forkserver, "_forkserver", None)
    if server is None or not hasattr(server, "_stop") or not hasattr(server, "_forkserver_pid"):
        return
    pid, recorded = getattr(server, RECORD, (None, None))
    if pid == server._forkserver_pid and recorded is not None \
            and source_fingerprint(list(recorded)) != recorded:
        server._stop()
    with callers_search_path():
        server.ensure_running()
    if getattr(server, RECORD, (None, None))[0] != server._forkserver_pid:
        setattr(server, RECORD,
                (server._forkserver_pid, source_fingerprint(package_sources(preload))))


@contextmanager
def callers_search_path() -> Iterator[None]:
    """Start the server with the caller's sys.path in PYTHONPATH, then restore the environment.

    multiprocessing hands the server the caller's sys.path, but Python before 3.12.8 ignores it
    (CPython issue 117378): a preloaded module found only through it, such as a test module or a
    script's own folder, was silently not imported, and each rank imported it for itself.
    """
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(entry for entry in sys.path if entry)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def package_sources(module_names: list[str]) -> list[str]:
    """The .py files of the top-level packages of `module_names` (torch's excepted).

    A server that preloads `lesson_code.collectives` has also imported what that module imports
    from its package, so the whole package is watched, not only the one file.
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
            files.add(path)
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
