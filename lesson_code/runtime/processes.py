"""The rank processes behind `launch.spawn`: their body, and the caller's watch over them
(lessons 76-81).

`launch.spawn` decides what to run, and `lesson_code.runtime.fork_server` how a rank process
starts; this module owns what happens next:

- `rank_main`: the body of a rank; it runs with the caller's environment of the moment, exits
  within moments of the caller dying, even of SIGKILL, and its output is captured
  (`lesson_code.runtime.output`);
- `collect_results`: waits, bounded, for every rank, forwarding what the ranks print;
- `stop_all`: leaves no process behind.
Standard library and torch only.
"""

from __future__ import annotations

import ctypes
import faulthandler
import multiprocessing.connection as mp_connection
import os
import pickle
import select
import shutil
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from lesson_code.runtime.devices import to_cpu
from lesson_code.runtime.errors import (RankCrashedError, RankFailedError, RankTimeoutError,
                                     waiting_calls)
from lesson_code.runtime.output import RankOutput, flush_rank_output, redirect_rank_output

CAUSE_GRACE_S = 1.0  # after a rank's error, how long to watch for a crash that caused it
# At the timeout, the caller asks each rank still running for its stack with this signal, and
# waits this long for the answers, to say in the error where each rank was waiting.
STACK_SIGNAL = getattr(signal, "SIGUSR1", None)
STACK_WAIT_S = 2.0
FORWARD_EVERY_S = 0.2  # how often the caller copies what the ranks printed to its own streams
PR_SET_PDEATHSIG = 1  # from <sys/prctl.h>


def rank_main(call: bytes, rank, world_size, backend, init_method, timeout_s, writer,
              output_paths: tuple[str, str], stack_path: str,
              environment: dict[str, str], run_folder: str) -> None:
    """Body of one rank process: join the group, run fn, send back ("ok", bytes) or ("error", text).

    `environment` replaces the process's own first: a rank forked by the fork server inherited
    the server's, from when the server started (`fork_server.rank_environment`). `run_folder`
    holds the run's store and output files; the rank removes it if the caller dies first.

    `call` is the pickled (fn, args), unpickled here so that a failure to import fn's module is
    reported with its traceback like any other error of the rank. ("started", None) goes first,
    just before fn runs, so that a rank that then dies without a word is not said never to have
    started it. On STACK_SIGNAL the rank
    writes the stacks of its threads to `stack_path` (Python's faulthandler, which answers even
    while the rank is blocked inside a C++ call), for the caller's timeout error.
    """
    exit_with_caller(writer, run_folder)
    os.environ.clear()
    os.environ.update(environment)
    redirect_rank_output(*output_paths)
    if STACK_SIGNAL is not None:
        stacks = open(stack_path, "w")  # open for the rank's whole life: faulthandler writes here
        faulthandler.register(STACK_SIGNAL, file=stacks, all_threads=True)
    torch.set_num_threads(1)
    try:
        fn, args = pickle.loads(call)
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(
            backend, init_method=init_method, rank=rank, world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        writer.send(("started", None))
        result = fn(rank, world_size, *args)
        message = ("ok", pickle.dumps(to_cpu(result)))  # by value: no memory shared with the rank
    except BaseException:  # noqa: BLE001 - every failure, KeyboardInterrupt included, is reported
        flush_rank_output()
        writer.send(("error", traceback.format_exc()))
        writer.close()
        # Skip interpreter teardown: destroying a group whose peers are mid-collective can block.
        os._exit(1)
    flush_rank_output()
    writer.send(message)
    writer.close()
    try:
        # Leave together: a rank that tore its group down while a peer was still connecting
        # (a function with no collective) would make that peer fail.
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - a peer failed; the caller reports that peer
        os._exit(1)


def exit_with_caller(writer, run_folder: str) -> None:
    """Make this rank exit within moments of the process that spawned it dying, SIGKILL included,
    removing `run_folder`, which the caller can no longer remove.

    A rank blocked in a collective would otherwise live on until its timeout (minutes) after a
    notebook kernel is killed. Two watches: on Linux the kernel sends SIGKILL when the parent
    process dies (prctl PR_SET_PDEATHSIG); and, everywhere poll() exists, a thread waits for
    the caller's end of the result pipe to close, which happens however the caller ends (the
    parent of a rank started by the fork server is that server, which outlives the caller).
    """
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass  # the pipe watch below still applies
    if hasattr(select, "poll"):
        watched = os.dup(writer.fileno())  # stays open after the rank closes its writer
        threading.Thread(target=_exit_when_closed, args=(watched, run_folder),
                         name="caller-watch", daemon=True).start()


def _exit_when_closed(fd: int, run_folder: str) -> None:
    """Block until the reading end of the pipe `fd` writes to is closed, then remove
    `run_folder` and exit the process.

    The caller closes that end only after its ranks have stopped (and removes the folder
    itself), or when it dies: killed by SIGTERM or SIGKILL, its store and the ranks' output
    files would stay in the temporary folder. A rank of the fork server outlives the caller by
    these moments and removes them; a rank of the "spawn" start method on Linux is killed with
    its caller (its parent) by the kernel first, so a killed caller of that method leaves them.
    """
    poller = select.poll()
    poller.register(fd, 0)  # no events asked for: POLLERR / POLLHUP come anyway, on close
    while True:
        if any(event & (select.POLLERR | select.POLLHUP | select.POLLNVAL)
               for _, event in poller.poll()):
            shutil.rmtree(run_folder, ignore_errors=True)  # every rank tries; one suffices
            os._exit(1)


def collect_results(processes, readers, world_size: int, timeout_s: float,
                    output: RankOutput) -> list[Any]:
    """Wait, bounded by timeout_s, for every rank's message; raise on the first failure.

    When one rank dies, its peers soon fail too ("connection closed") and may report first. So
    after the first error the others get CAUSE_GRACE_S more to show a crash, which is the likelier
    cause; otherwise the first error reported is raised. What the ranks print is forwarded.
    """
    deadline = time.monotonic() + timeout_s
    results: dict[int, Any] = {}
    failed: set[int] = set()
    started: set[int] = set()  # ranks that began to run fn
    first_error: RankFailedError | None = None
    rank_of = {id(reader): rank for rank, reader in enumerate(readers)}
    rank_of.update({process.sentinel: rank for rank, process in enumerate(processes)})
    while len(results) + len(failed) < world_size:
        output.forward()
        remaining = deadline - time.monotonic()
        if first_error is not None:
            remaining = min(remaining, first_error.raised_at + CAUSE_GRACE_S - time.monotonic())
            if remaining <= 0:
                raise first_error
        elif remaining <= 0:
            still_running = sorted(set(range(world_size)) - set(results))
            raise RankTimeoutError(still_running, world_size, timeout_s,
                                   {rank: output.tail(rank) for rank in still_running},
                                   where_ranks_wait(processes, still_running, output))
        waiting = [rank for rank in range(world_size) if rank not in results and rank not in failed]
        waitables = [readers[rank] for rank in waiting] + [processes[rank].sentinel for rank in waiting]
        for ready in mp_connection.wait(waitables, timeout=min(remaining, FORWARD_EVERY_S)):
            rank = rank_of[ready if isinstance(ready, int) else id(ready)]
            if rank in results or rank in failed:
                continue
            kind, payload = read_message(readers[rank], processes[rank], rank, world_size, output,
                                         rank in started)
            if kind == "started":
                started.add(rank)
            elif kind == "error":
                failed.add(rank)
                first_error = first_error or RankFailedError(rank, world_size, payload,
                                                             output.tail(rank))
            elif kind == "ok":
                results[rank] = pickle.loads(payload)
    if first_error is not None:
        raise first_error
    return [results[rank] for rank in range(world_size)]


def where_ranks_wait(processes, ranks: list[int], output: RankOutput) -> dict[int, list[str]]:
    """Ask each of `ranks` for its stack (STACK_SIGNAL) and return where it was waiting
    (`errors.waiting_calls`), for the ranks that answered within STACK_WAIT_S."""
    if STACK_SIGNAL is None:
        return {}
    asked = []
    for rank in ranks:
        try:
            os.kill(processes[rank].pid, STACK_SIGNAL)
            asked.append(rank)
        except (OSError, TypeError):  # already gone, or never started
            pass
    deadline = time.monotonic() + STACK_WAIT_S
    while time.monotonic() < deadline and not all(
            waiting_calls(output.stacks(rank)) for rank in asked):
        time.sleep(0.05)
    return {rank: waiting_calls(output.stacks(rank)) for rank in asked
            if output.stacks(rank).strip()}


def read_message(reader, process, rank: int, world_size: int, output: RankOutput,
                 started: bool) -> tuple[str, Any]:
    """Read a rank's message; a rank that exited without one is reported as crashed (`started`:
    after it began to run its function)."""
    try:
        if reader.poll(0.5 if not process.is_alive() else 0):
            return reader.recv()
    except (EOFError, OSError):
        pass
    if process.is_alive():
        return "pending", None
    process.join(1.0)
    raise RankCrashedError(rank, world_size, process.exitcode, output.tail(rank), started)


def stop_all(processes, grace_s: float) -> None:
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
        if not process.is_alive():  # one stuck in the kernel after SIGKILL cannot be closed yet
            process.close()
