"""How a rank starts: the course's own fork server and the environment each rank gets (lessons 76-81).

`launch.spawn` asks `start_context` for the processes of a run. With the "spawn" start method
each rank is a fresh interpreter that imports torch itself (seconds per rank). With the default,
"forkserver", a server process imports torch, the course modules the caller has imported and
the rank function's module once, and forks every rank from itself (a fraction of a second).

The server is the course's own (`SERVER`, with `RankProcess` and `ServerContext` bound to it),
not the one multiprocessing shares with everything else in the caller: a Pool, a
ProcessPoolExecutor or a DataLoader's workers use that one (forkserver is Python 3.14's default
start method on Linux). So the course never adopts a server that something else started without
its imports and environment, and stopping its own never waits for someone else's children.
Its life, run after run:

1. start: on the first run, with CHILD_ENVIRONMENT set and, in two more variables
   (`handover`), the caller's sys.path and the modules to import, which
   `lesson_code.runtime.server_imports` (imported there by name) reads, removes and imports;
   the size and modification time of every source file of those modules' packages are recorded;
2. reuse: each later run compares those files with the disk and forks from the same server;
3. restart: a server whose files changed (the package edited in a running notebook kernel)
   is stopped and a new one started, so that the edit reaches the ranks. Stopping closes the
   server's "alive" pipe, which ends it once no rank of the course holds the pipe (spawn never
   leaves one running), waits at most STOP_WAIT_S, then kills it;
4. end: it exits with the caller, whose end of the alive pipe closes then. A caller that was
   killed could not remove the server's socket and its folder, as it does when it exits: the
   server removes them then (`remove_socket_when_orphaned`, registered by server_imports).

A forked rank inherits the server's environment from when the server started, not the caller's
of now: a notebook that sets GLOO_SOCKET_IFNAME after its first run would not reach its ranks.
So spawn hands every rank the caller's environment of the moment (`rank_environment`), which
`processes.rank_main` installs before anything reads it.

Multiprocessing's ForkServer keeps its process id, alive pipe, socket address and lock in
private attributes, the same from Python 3.11 to 3.14, and its Popen asks the process-wide
server for each process, so `ServerPopen` repeats its few lines with `SERVER` instead. On a
Python without those attributes the server is never restarted: edits reach the ranks after the
caller restarts. Standard library only.
"""

from __future__ import annotations

import io
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from contextlib import contextmanager
from multiprocessing import context, forkserver, popen_forkserver, reduction, spawn, util
from typing import Any, Callable, Iterator

# Set in every rank: c10d's hostname and socket warnings would otherwise fill notebook outputs on
# machines without DNS; torchrun sets OMP_NUM_THREADS=1 itself. When the caller is `python -m
# lesson_code.<lesson>`, multiprocessing re-runs that module in each rank as __mp_main__ and runpy
# warns that it is already imported (it is: the rank function's module imports it); the second
# run only defines functions, so that one warning is silenced. The server starts with them too:
# torch reads TORCH_CPP_LOG_LEVEL when the server imports it.
CHILD_ENVIRONMENT = {
    "TORCH_CPP_LOG_LEVEL": "ERROR",
    "OMP_NUM_THREADS": "1",
    "PYTHONWARNINGS": "ignore::RuntimeWarning:runpy",
}
# What the server imports when it starts. torch._dynamo: torch.optim imports it when the first
# optimizer is built (seconds per rank). The caller's modules go through server_imports, which
# skips one that fails (multiprocessing would stop the server, and every later run with it).
PRELOADED = ["torch", "torch.distributed", "torch._dynamo", "lesson_code.runtime.server_imports"]
# The course modules the server does not import even when the caller has: they draw or build the book.
NOT_PRELOADED = ("lesson_code.plots", "lesson_code.widgets", "lesson_code.book_build")
# What the caller hands the starting server (JSON lists): its sys.path, and the modules to import.
PATH_VARIABLE = "LESSON_CODE_SERVER_SYS_PATH"
MODULES_VARIABLE = "LESSON_CODE_SERVER_MODULES"
# How long a stopped server may take to exit before it is killed: it exits within milliseconds
# of its alive pipe closing, unless a process forked from the caller holds a copy of the pipe.
STOP_WAIT_S = 0.5
# The longest socket path the kernel takes, in bytes without the final NUL (sun_path holds 108 on
# Linux, 104 on macOS), and where a socket goes when the caller's temporary folder is too long.
SOCKET_PATH_MAX = 103
SHORT_TEMPORARY_FOLDERS = ("/tmp", "/var/tmp")
# multiprocessing.forkserver.ForkServer's private attributes that a restart needs.
SERVER_STATE = ("_forkserver_pid", "_forkserver_alive_fd", "_forkserver_address", "_lock")


class CourseForkServer(forkserver.ForkServer):
    """Multiprocessing's fork server, used by the course's ranks only; knows what it imported."""

    def __init__(self) -> None:
        super().__init__()
        self.set_forkserver_preload(PRELOADED)
        self.sources: dict[str, tuple[int, int]] = {}  # source_fingerprint of what it imported
        self.sources_of: int | None = None  # the process id of the server `sources` describe

    def ensure_current(self, modules: list[str]) -> None:
        """Make sure the server runs, first stopping one whose imported sources changed; a
        server started here imports `modules` (see the module docstring).

        Call only while no rank of the course runs (`spawn` never leaves one), from one thread
        at a time.
        """
        restartable = all(hasattr(self, name) for name in SERVER_STATE)
        running = self._forkserver_pid if restartable else None
        if running is not None and running == self.sources_of \
                and source_fingerprint(list(self.sources)) != self.sources:
            self.stop()
        with child_environment(handover(modules)), socket_folder_short_enough():
            self.ensure_running()
        running = self._forkserver_pid if restartable else None
        if running != self.sources_of:
            self.sources_of, self.sources = running, source_fingerprint(package_sources(modules))

    def connect_to_new_process(self, fds):
        """Multiprocessing's request for a new process, once the caller is known to have room for
        the files it opens. Multiprocessing opens a socket to the server, then one pipe, then
        another: a caller out of files (a notebook that leaked many) fails midway, the pipe
        opened first stays open in the caller for good, and the request cut short ends the
        server (its read of the request meets EOF), which refuses the next runs until it is
        gone. Opening as many files first, and closing them, makes that a clean OSError."""
        spare: list[int] = []
        try:
            for _ in range(2):
                spare.extend(os.pipe())
            with socket.socket(socket.AF_UNIX):
                pass
        finally:
            for fd in spare:
                os.close(fd)
        return super().connect_to_new_process(fds)

    def stop(self) -> None:
        """Stop the server: close its alive pipe, which ends it, and reap it, killing it after
        STOP_WAIT_S (a process forked from the caller may still hold a copy of the pipe)."""
        with self._lock:
            pid, alive, address = (self._forkserver_pid, self._forkserver_alive_fd,
                                   self._forkserver_address)
            if pid is None:
                return
            self._forkserver_pid = self._forkserver_alive_fd = self._forkserver_address = None
            os.close(alive)
            if not _reaped(pid, STOP_WAIT_S):
                os.kill(pid, signal.SIGKILL)
                _reaped(pid, STOP_WAIT_S)
            if isinstance(address, str) and not util.is_abstract_socket_namespace(address):
                try:
                    os.unlink(address)
                except OSError:
                    pass


@contextmanager
def socket_folder_short_enough() -> Iterator[None]:
    """Let the server's socket be made in a folder whose path the kernel takes.

    Multiprocessing binds the server's socket at "<its temporary folder>/listener-XXXXXXXX",
    its folder made once per process in TMPDIR. A socket's path holds at most 107 bytes on
    Linux (103 on macOS): under a long TMPDIR (a test runner's folder per test, a deep home)
    the bind fails with "AF_UNIX path too long" and no rank starts. Then, while the server
    starts, multiprocessing is given a folder of the course's own in the first short system
    temporary folder, removed when the caller exits (or by the server, if the caller was killed:
    `remove_socket_when_orphaned`); its own folder stays what it was for everything else.
    """
    config = mp.current_process()._config
    chosen = config.get("tempdir")
    folder = chosen if chosen is not None else tempfile.gettempdir()
    # the socket's path: folder, "/pymp-" and 8 characters if it is still to be made, "/listener-" and 8
    if len(os.fsencode(folder)) + (0 if chosen else 14) + 18 <= SOCKET_PATH_MAX:
        yield
        return
    base = next((place for place in SHORT_TEMPORARY_FOLDERS
                 if os.path.isdir(place) and os.access(place, os.W_OK | os.X_OK)), None)
    if base is None:
        raise OSError(
            f"the temporary folder {folder!r} is too long for the fork server's socket "
            f"(at most {SOCKET_PATH_MAX - 32} bytes) and none of {SHORT_TEMPORARY_FOLDERS} can "
            "be written: set TMPDIR to a shorter folder, or pass start_method='spawn'")
    short = tempfile.mkdtemp(prefix="pymp-", dir=base)
    util.Finalize(None, shutil.rmtree, args=(short, True), exitpriority=-100)
    config["tempdir"] = short
    try:
        yield
    finally:
        if chosen is None:
            config.pop("tempdir", None)
        else:
            config["tempdir"] = chosen


def _reaped(pid: int, seconds: float) -> bool:
    """Wait at most `seconds` for the child `pid` to exit and reap it; False if it still runs."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return True
        except ChildProcessError:  # reaped already
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


# The one server of this process, reused run after run: starting it is what a run must not pay.
SERVER = CourseForkServer()


class ServerPopen(popen_forkserver.Popen):
    """Multiprocessing's start of a process by a fork server, asking SERVER for it."""

    def _launch(self, process_obj) -> None:
        # popen_forkserver.Popen._launch (the same in Python 3.11 to 3.14), with SERVER in place
        # of the process-wide server it asks.
        prep_data = spawn.get_preparation_data(process_obj._name)
        buf = io.BytesIO()
        context.set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            context.set_spawning_popen(None)
        self.sentinel, w = SERVER.connect_to_new_process(self._fds)
        # A duplicate of the data pipe's write end: the child's sentinel of its parent.
        _parent_w = os.dup(w)
        self.finalizer = util.Finalize(self, util.close_fds, (_parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class RankProcess(context.ForkServerProcess):
    """A process forked by SERVER."""

    @staticmethod
    def _Popen(process_obj):
        return ServerPopen(process_obj)


class ServerContext(context.ForkServerContext):
    """Multiprocessing's forkserver context, whose processes SERVER forks."""

    Process = RankProcess


def remove_socket_when_orphaned(caller: int) -> None:
    """In the server, as it exits: if its caller (process `caller`, its parent) died first,
    remove the server's socket and the folder multiprocessing made for it in the caller's
    temporary folder, which the caller would have removed itself."""
    if os.getppid() == caller:
        return
    # multiprocessing's main() records the address of the server it runs on its own object.
    address = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_address", None)
    if isinstance(address, str) and not util.is_abstract_socket_namespace(address):
        for remove, path in ((os.unlink, address), (os.rmdir, os.path.dirname(address))):
            try:
                remove(path)
            except OSError:  # gone already, or the folder holds something else
                return


def start_context(start_method: str | None, fn: Callable[..., Any]):
    """The multiprocessing context that starts the ranks of a run of `fn`.

    "forkserver" (the default where it exists): SERVER, started or restarted here (see the
    module docstring), importing the course modules the caller has imported
    (`course_modules_imported`) and fn's module. "spawn": multiprocessing's own.
    Raises ValueError for any other start method.
    """
    methods = mp.get_all_start_methods()
    method = start_method or ("forkserver" if "forkserver" in methods else "spawn")
    if method not in ("forkserver", "spawn"):
        raise ValueError(
            f"start_method {method!r} is not supported: use 'forkserver' or 'spawn' (plain fork "
            "from a process that already ran threaded torch ops makes ranks hang)"
        )
    if method == "spawn":
        return mp.get_context("spawn")
    SERVER.ensure_current([*course_modules_imported(), fn.__module__])
    return ServerContext()


def course_modules_imported() -> list[str]:
    """The lesson_code modules the caller has imported, for a starting fork server to import.

    Each rank is a new process: whatever its function's module imports, it imports again,
    compiling the source where no bytecode cache is written (a quarter of a second of CPU per
    rank for the practice checks' modules, measured on a 2-core machine that writes none). The
    caller has already imported the modules its rank functions use (the launcher's among them),
    so the server imports those once, and a rank starts with them. The modules that draw or
    build the book are left out: no rank uses them, and they would add matplotlib, widgets and
    Sphinx to every server's start.
    """
    return sorted(name for name in list(sys.modules)
                  if name.startswith("lesson_code.") and "__main__" not in name
                  and not name.startswith(NOT_PRELOADED))


def rank_environment() -> dict[str, str]:
    """The environment a rank runs with: the caller's of this moment, CHILD_ENVIRONMENT on top."""
    return {**os.environ, **CHILD_ENVIRONMENT}


@contextmanager
def child_environment(extra: dict[str, str] | None = None) -> Iterator[None]:
    """Set CHILD_ENVIRONMENT, and `extra`, while ranks (and the fork server) start, then restore
    the caller's environment. A process started meanwhile starts with it: the fork server, and
    a rank of the "spawn" start method, whose interpreter reads PYTHONWARNINGS as it starts."""
    variables = {**CHILD_ENVIRONMENT, **(extra or {})}
    saved = {key: os.environ.get(key) for key in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def handover(modules: list[str]) -> dict[str, str]:
    """PATH_VARIABLE and MODULES_VARIABLE for a server that starts now, set in the caller's
    environment only while it starts (`child_environment`).

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
