"""Start and tear down torch.distributed process groups: the launcher of every lesson (76-81).

From Python or a notebook, run a package function on 4 fresh ranks and collect what each returns:

    from lesson_code import launch, collectives
    results = launch.spawn(collectives.check_against_builtin, world_size=4)

From a shell, the same worker functions run under torchrun, each process being one rank:

    torchrun --standalone --nproc-per-node=4 -m lesson_code.collectives

`spawn` never hangs and never leaves a rank behind: a rank that raises ends the run within
seconds with its traceback, a rank that hangs ends it at `timeout_s`, and every rank process is
stopped before `spawn` returns or raises. Only the standard library and torch are imported here.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import pickle
import shutil
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from lesson_code.devices import (  # noqa: F401 - re-exported: launch.current_device etc.
    BACKENDS,
    current_device,
    rank_device,
    resolve_backend,
    to_cpu,
)
from lesson_code.rank_errors import (  # noqa: F401 - re-exported: launch.RankFailedError etc.
    RankCrashedError,
    RankFailedError,
    RankTimeoutError,
    SpawnError,
)

DEFAULT_TIMEOUT_S = 120.0
CAUSE_GRACE_S = 1.0  # after a rank's error, how long to watch for a crash that caused it
# Set in every rank before torch is imported there: c10d's hostname and socket warnings would
# otherwise fill notebook outputs on machines without DNS; torchrun sets OMP_NUM_THREADS=1 itself.
# When the caller is `python -m lesson_code.<lesson>`, multiprocessing re-runs that module in each
# rank as __mp_main__ and runpy warns that it is already imported (it is: the rank function's
# module imports it); the second run only defines functions, so that one warning is silenced.
CHILD_ENVIRONMENT = {
    "TORCH_CPP_LOG_LEVEL": "ERROR",
    "OMP_NUM_THREADS": "1",
    "PYTHONWARNINGS": "ignore::RuntimeWarning:runpy",
}


def spawn(
    fn: Callable[..., Any],
    *args: Any,
    world_size: int = 4,
    backend: str = "auto",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    start_method: str | None = None,
) -> list[Any]:
    """Run `fn(rank, world_size, *args)` on `world_size` new processes; return results by rank.

    Each rank runs inside an initialised default process group (one torch thread, quiet c10d
    logs). `fn` must live in an importable module, not in a notebook. Results come back by value
    (pickled in the rank), so returned tensors outlive the rank that made them.

    The default start method is a fork server that has imported torch once, so a run starts in
    a fraction of a second instead of re-importing torch in every rank; that one server process
    is reused by later calls and exits with the caller. Rank processes never outlive the call.

    Raises ValueError for bad arguments, RankFailedError when a rank raises (with its traceback),
    RankCrashedError when a rank dies without reporting, RankTimeoutError after `timeout_s`.
    """
    backend = resolve_backend(backend, world_size)
    check_importable(fn)
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
    context = _start_context(start_method, fn)
    store_dir = tempfile.mkdtemp(prefix="lesson_code_store_")
    init_method = "file://" + os.path.join(store_dir, "store")
    processes, readers = [], []
    completed = False
    try:
        with _child_environment():
            for rank in range(world_size):
                reader, writer = context.Pipe(duplex=False)
                process = context.Process(
                    target=_rank_main,
                    args=(fn, args, rank, world_size, backend, init_method, timeout_s, writer),
                    name=f"rank{rank}",
                    daemon=True,
                )
                process.start()
                writer.close()  # the parent keeps only the reading end, so a dead rank reads as EOF
                processes.append(process)
                readers.append(reader)
        results = _collect_results(processes, readers, world_size, timeout_s)
        completed = True
        return results
    finally:
        # After success the ranks are only tearing down their group: give them time to exit cleanly.
        _stop_all(processes, grace_s=10.0 if completed else 0.0)
        for reader in readers:
            reader.close()
        shutil.rmtree(store_dir, ignore_errors=True)


def check_importable(fn: Callable[..., Any]) -> None:
    """Raise ValueError unless the ranks can import `fn` (not a lambda, not from a notebook)."""
    if not callable(fn):
        raise ValueError(f"fn must be a function defined in a module, got {fn!r}")
    main = sys.modules.get("__main__")
    interactive = fn.__module__ == "__main__" and not getattr(main, "__file__", None)
    if interactive or "<lambda>" in getattr(fn, "__qualname__", "") \
            or "<locals>" in getattr(fn, "__qualname__", ""):
        raise ValueError(
            f"{getattr(fn, '__qualname__', fn)!r} cannot be imported by the rank processes (a "
            "lambda, a nested function, or a function defined in a notebook): define it at the "
            "top level of a module, e.g. in lesson_code, and pass that function"
        )


def under_torchrun() -> bool:
    """True when this process was started by torchrun (RANK and WORLD_SIZE are set)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init_from_env(backend: str = "auto", timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[int, int]:
    """Join the process group torchrun describes in the environment; return (rank, world_size).

    Collective: call on every rank. Sets one torch thread per rank and, under NCCL, the rank's
    GPU (LOCAL_RANK). Raises ValueError when the environment has no RANK/WORLD_SIZE.
    """
    if not under_torchrun():
        raise ValueError(
            "RANK and WORLD_SIZE are not set: start this under torchrun, e.g. "
            "`torchrun --standalone --nproc-per-node=4 -m lesson_code.collectives`, "
            "or use launch.spawn from Python"
        )
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # Over several nodes each node needs a GPU per local rank, not one per rank of the world.
    backend = resolve_backend(backend, int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group(
        backend, init_method="env://", rank=rank, world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    return rank, world_size


def run(fn: Callable[..., Any], *args: Any, world_size: int = 4, backend: str = "auto",
        timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Any]:
    """Run `fn(rank, world_size, *args)` on every rank; return all ranks' results by rank.

    Under torchrun (one node or several) this process is one rank: the first call joins the group
    from the environment, later calls reuse it, and it is destroyed when the process exits; `fn`
    runs and every rank's result is gathered (so each process returns the same list, and
    `world_size` is torchrun's). Otherwise it calls `spawn`. A module's `main()` uses this to run
    unchanged both ways, and may call it several times.
    """
    if not under_torchrun():
        return spawn(fn, *args, world_size=world_size, backend=backend, timeout_s=timeout_s)
    if not dist.is_initialized():
        # One group per process: a second default group would find the first one's addresses
        # in torchrun's store, which outlives it, and gloo would connect to closed ports.
        init_from_env(backend, timeout_s)
        atexit.register(_destroy_group)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    result = to_cpu(fn(rank, world_size, *args))
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, result)
    return gathered


def _destroy_group() -> None:
    """Tear down the torchrun group that `run` joined, unless the caller already did."""
    if dist.is_initialized():
        dist.destroy_process_group()


def is_reporting_process() -> bool:
    """True in the one process that should print a run's report: rank 0, or any non-torchrun caller."""
    return not under_torchrun() or int(os.environ["RANK"]) == 0


def _rank_main(fn, args, rank, world_size, backend, init_method, timeout_s, writer) -> None:
    """Body of one rank process: join the group, run fn, send back ("ok", bytes) or ("error", text)."""
    torch.set_num_threads(1)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(
            backend, init_method=init_method, rank=rank, world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        result = fn(rank, world_size, *args)
        message = ("ok", pickle.dumps(to_cpu(result)))  # by value: no memory shared with the rank
    except BaseException:  # noqa: BLE001 - every failure, KeyboardInterrupt included, is reported
        writer.send(("error", traceback.format_exc()))
        writer.close()
        # Skip interpreter teardown: destroying a group whose peers are mid-collective can block.
        os._exit(1)
    writer.send(message)
    writer.close()
    dist.destroy_process_group()


def _collect_results(processes, readers, world_size: int, timeout_s: float) -> list[Any]:
    """Wait, bounded by timeout_s, for every rank's message; raise on the first failure.

    When one rank dies, its peers soon fail too ("connection closed") and may report first. So
    after the first error the others get CAUSE_GRACE_S more to show a crash, which is the likelier
    cause; otherwise the first error reported is raised.
    """
    deadline = time.monotonic() + timeout_s
    results: dict[int, Any] = {}
    failed: set[int] = set()
    first_error: RankFailedError | None = None
    rank_of = {id(reader): rank for rank, reader in enumerate(readers)}
    rank_of.update({process.sentinel: rank for rank, process in enumerate(processes)})
    while len(results) + len(failed) < world_size:
        remaining = deadline - time.monotonic()
        if first_error is not None:
            remaining = min(remaining, first_error.raised_at + CAUSE_GRACE_S - time.monotonic())
            if remaining <= 0:
                raise first_error
        elif remaining <= 0:
            still_running = sorted(set(range(world_size)) - set(results))
            raise RankTimeoutError(still_running, world_size, timeout_s)
        waiting = [rank for rank in range(world_size) if rank not in results and rank not in failed]
        waitables = [readers[rank] for rank in waiting] + [processes[rank].sentinel for rank in waiting]
        for ready in mp_connection.wait(waitables, timeout=remaining):
            rank = rank_of[ready if isinstance(ready, int) else id(ready)]
            if rank in results or rank in failed:
                continue
            kind, payload = _read_message(readers[rank], processes[rank], rank, world_size)
            if kind == "error":
                failed.add(rank)
                first_error = first_error or RankFailedError(rank, world_size, payload)
            elif kind == "ok":
                results[rank] = pickle.loads(payload)
    if first_error is not None:
        raise first_error
    return [results[rank] for rank in range(world_size)]


def _read_message(reader, process, rank: int, world_size: int) -> tuple[str, Any]:
    """Read a rank's message; a rank that exited without one is reported as crashed."""
    try:
        if reader.poll(0.5 if not process.is_alive() else 0):
            return reader.recv()
    except (EOFError, OSError):
        pass
    if process.is_alive():
        return "pending", None
    process.join(1.0)
    raise RankCrashedError(rank, world_size, process.exitcode)


def _stop_all(processes, grace_s: float) -> None:
    """Stop every rank process: wait briefly for clean exits, then SIGTERM, then SIGKILL."""
    deadline = time.monotonic() + grace_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(1.0)
        if process.is_alive():
            process.kill()
            process.join(5.0)
    for process in processes:
        process.close()


def _start_context(start_method: str | None, fn: Callable[..., Any]):
    """Multiprocessing context for the ranks; the fork server preloads torch and fn's module."""
    methods = mp.get_all_start_methods()
    method = start_method or ("forkserver" if "forkserver" in methods else "spawn")
    if method not in ("forkserver", "spawn"):
        raise ValueError(
            f"start_method {method!r} is not supported: use 'forkserver' or 'spawn' (plain fork "
            "from a process that already ran threaded torch ops makes ranks hang)"
        )
    context = mp.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload(["torch", "torch.distributed", fn.__module__])
    return context


@contextmanager
def _child_environment() -> Iterator[None]:
    """Set CHILD_ENVIRONMENT while ranks (and the fork server) start, then restore the caller's."""
    saved = {key: os.environ.get(key) for key in CHILD_ENVIRONMENT}
    os.environ.update(CHILD_ENVIRONMENT)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
