"""Start and tear down torch.distributed process groups: the launcher of every lesson (76-81).

From Python or a notebook, run a package function on 4 fresh ranks and collect what each returns:

    from lesson_code import launch, collectives_lab
    results = launch.spawn(collectives_lab.compare_with_builtin, 1001, "float32", world_size=4)

From a shell, the same worker functions run under torchrun, each process being one rank:

    torchrun --standalone --nproc-per-node=4 -m lesson_code.collectives_lab

`spawn` never hangs and never leaves a rank behind: a rank that raises ends the run within
seconds with its traceback, a rank that hangs ends it at `timeout_s` with the calls each rank
still running was waiting in, and every rank process is stopped before `spawn` returns or raises. Only the standard library and torch are imported here.
"""

from __future__ import annotations

import atexit
import json
import os
import pickle
import shutil
import sys
import tempfile
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from lesson_code.runtime.devices import (  # noqa: F401 - re-exported: launch.current_device etc.
    BACKENDS,
    current_device,
    rank_device,
    resolve_backend,
    to_cpu,
)
from lesson_code.runtime.errors import (  # noqa: F401 - re-exported: launch.RankFailedError etc.
    RankCrashedError,
    RankFailedError,
    RankTimeoutError,
    SpawnError,
)
from lesson_code.runtime.fork_server import child_environment, rank_environment, start_context
from lesson_code.runtime.output import RankOutput
from lesson_code.runtime.processes import collect_results, rank_main, stop_all
from lesson_code.runtime.validate import require_positive

DEFAULT_TIMEOUT_S = 120.0


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

    The default start method is the course's own fork server (`runtime.fork_server`), which has
    imported torch once, so a run starts in a fraction of a second instead of re-importing torch
    in every rank; that one server process is reused by later calls (restarted when the package
    it imported was edited since) and exits with the caller. Every rank runs with the caller's
    environment as it is at this call. Rank processes never outlive the call, nor the caller if
    it is killed.
    What the ranks print is copied to this process's sys.stdout / sys.stderr (in a notebook:
    under the cell), and the last lines of a failing rank's output travel with the error.

    Raises ValueError for bad arguments, RankFailedError when a rank raises (with its traceback),
    RankCrashedError when a rank dies without reporting, RankTimeoutError after `timeout_s`
    (its `where` says, for each rank still running, the calls it was waiting in).
    """
    backend = resolve_backend(backend, world_size)
    check_importable(fn)
    require_positive("timeout_s", timeout_s, "the seconds the ranks may run, such as 120")
    call = pickle.dumps((fn, args))  # unpickled in the rank, where a failure is reported
    context = start_context(start_method, fn)
    environment = rank_environment()  # the caller's of now, not the fork server's at its start
    store_dir = tempfile.mkdtemp(prefix="lesson_code_store_")
    init_method = "file://" + os.path.join(store_dir, "store")
    output = RankOutput(store_dir, world_size)
    processes, readers = [], []
    completed = False
    try:
        with child_environment():
            for rank in range(world_size):
                reader, writer = context.Pipe(duplex=False)
                readers.append(reader)
                process = context.Process(
                    target=rank_main,
                    args=(call, rank, world_size, backend, init_method, timeout_s, writer,
                          output.paths(rank), output.stack_path(rank), environment, store_dir),
                    name=f"rank{rank}",
                    daemon=True,
                )
                try:
                    process.start()
                finally:  # started or not, the parent keeps only the reading end (EOF: rank died)
                    writer.close()
                processes.append(process)
        results = collect_results(processes, readers, world_size, timeout_s, output)
        completed = True
        return results
    finally:
        # After success the ranks are only tearing down their group: give them time to exit cleanly.
        stop_all(processes, grace_s=10.0 if completed else 0.0)
        output.forward(final=True)
        for reader in readers:
            reader.close()
        shutil.rmtree(store_dir, ignore_errors=True)


def check_importable(fn: Callable[..., Any]) -> None:
    """Raise ValueError unless the ranks can import `fn` (not a lambda, not from a notebook).

    A function of `__main__` is importable only when `__main__` is a script file: not in a
    notebook or a Python prompt, not under `python -c`. A script read from standard input
    (`python - <<EOF`, whose __file__ is "<stdin>") can spawn nothing: each rank would re-run it.
    """
    if not callable(fn):
        raise ValueError(f"fn must be a function defined in a module, got {fn!r}")
    name = repr(getattr(fn, "__qualname__", fn))
    if "<lambda>" in name or "<locals>" in name:
        raise ValueError(
            f"{name} cannot be imported by the rank processes (a lambda or a nested function): "
            "define it at the top level of a module, e.g. in lesson_code, and pass that function"
        )
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if main_file == "<stdin>":  # multiprocessing would re-run "<stdin>" as a file in every rank
        raise ValueError(
            "cannot spawn ranks from a script read from standard input (`python - <<EOF`): "
            "every rank re-runs the caller's main script, and standard input is no file it can "
            "read again. Save the script to a file and run `python that_file.py`, spawning "
            f"under `if __name__ == '__main__':` ({name} is the function it tried to run)"
        )
    from_file = bool(main_file) and os.path.isfile(main_file)
    if getattr(fn, "__module__", None) == "__main__" and not from_file:
        raise ValueError(
            f"{name} is defined in a notebook, a Python prompt or `python -c`, which the rank "
            "processes cannot import: put it at the top level of a module (e.g. in lesson_code) "
            "and pass that function, or save the script to a file and run `python "
            "that_file.py`, spawning under `if __name__ == '__main__':`"
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
            "`torchrun --standalone --nproc-per-node=4 -m lesson_code.collectives_lab`, "
            "or use launch.spawn from Python"
        )
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = timedelta(seconds=timeout_s)
    store, _, _ = next(dist.rendezvous("env://", rank=rank, world_size=world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = dist.PrefixStore(attempt_prefix(), store)
    backend = agree_on_setup(store, rank, world_size, backend)
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    return rank, world_size


def attempt_prefix() -> str:
    """The prefix under which this attempt of a torchrun job keeps its keys in torchrun's store.

    Since PyTorch 2.4 torchrun's agent hosts the store its workers use
    (TORCHELASTIC_USE_AGENT_STORE) and keeps it across restarts, so a restarted group would find
    the addresses the killed attempt's gloo or NCCL published there and connect to closed ports
    (pytorch/pytorch#135712): each attempt gets its own prefix, from TORCHELASTIC_RESTART_COUNT.
    That count is each agent's own: over several nodes an agent that restarts its workers only
    because another node failed keeps its count, so there set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
    in torchrun's environment; each attempt then gets a new store (hosted by rank 0), where the
    prefix is always the same.
    """
    shared = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") if shared else "0"
    return f"lesson_code/attempt/{attempt}"


def agree_on_setup(store, rank: int, world_size: int, backend: str) -> str:
    """The backend every rank will use, agreed through torchrun's store before the group exists.

    Each node decides from its own state (its GPUs, its LESSON_CODE_BACKEND) and runs its own
    install; were two nodes to differ, some ranks would start gloo and others NCCL, or run
    other code, and wait for each other until the timeout. So every rank publishes what it
    would use and its versions, and all decide alike: NCCL only when every rank can use it, else
    gloo (rank 0 says so). Raises ValueError on every rank when a rank cannot use the backend
    asked for, and RuntimeError when the ranks run different versions of torch or lesson_code.
    """
    from lesson_code import __version__

    try:  # over several nodes each node needs a GPU per local rank, not one per rank of the world
        mine = {"backend": resolve_backend(backend, int(os.environ.get("LOCAL_WORLD_SIZE",
                                                                        world_size)))}
    except ValueError as error:
        mine = {"error": str(error)}
    mine["versions"] = f"torch {torch.__version__}, lesson_code {__version__}"
    shared = dist.PrefixStore("lesson_code/setup", store)  # `store` is this attempt's
    shared.set(str(rank), json.dumps(mine))
    shared.wait([str(other) for other in range(world_size)])
    everyone = [json.loads(shared.get(str(other))) for other in range(world_size)]
    errors = [f"rank {other}: {seen['error']}" for other, seen in enumerate(everyone)
              if "error" in seen]
    if errors:
        raise ValueError(f"not every rank can use backend {backend!r}, so none starts: "
                         + "; ".join(errors))
    versions = {seen["versions"] for seen in everyone}
    if len(versions) > 1:
        raise RuntimeError("the ranks run different versions (" + "; ".join(
            f"rank {other}: {seen['versions']}" for other, seen in enumerate(everyone))
            + "): install the same torch and lesson_code on every node")
    backends = {seen["backend"] for seen in everyone}
    if len(backends) > 1:
        if rank == 0:
            print("lesson_code: some nodes have no GPU for each of their ranks: every rank uses "
                  "gloo", file=sys.stderr, flush=True)
        return "gloo"
    return backends.pop()


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
