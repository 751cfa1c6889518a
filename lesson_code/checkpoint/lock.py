"""The lock of a checkpoint folder (lesson 80): writers take turns, readers share, a waiter names who holds it.

Every save, recovery, prune and reshard into a folder holds root/.lock alone; a reader that must
look twice holds it shared. The lock is a flock(2) lock (BSD's call, on the open file), so the
kernel drops it when its process ends, however it ends: a killed save never blocks the next one. Beside it, each holder keeps a small record (what it is doing, its pid,
its host), so that a waiter that gives up says who held the folder and what to do.

    with locked(root, "save_sharded of step-00000010"):   # alone; waits up to LOCK_TIMEOUT_S
        ...
"""

from __future__ import annotations

import contextlib
import fcntl  # POSIX only, like the rest of the course's launchers
import json
import os
import secrets
import socket
import time
from pathlib import Path
from typing import Iterator

from lesson_code.checkpoint.files import CheckpointError

LOCK = ".lock"
# How long a wait for root/.lock lasts before it gives up, naming the holder: long enough for
# another writer to finish a large save or a prune to hash what it keeps; every function that
# takes the lock accepts `lock_timeout_s` to change it. A collective save waits at most half its
# group's collective timeout (`shards.save_sharded`), so that its other ranks, waiting for it in
# an all-gather, are still there to raise its error with it.
LOCK_TIMEOUT_S = 600.0


@contextlib.contextmanager
def locked(root: Path | str, doing: str, *, shared: bool = False,
           timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold root/.lock: alone to save, recover, prune or reshard; `shared` to read.

    A writer holds it alone, so two runs that save into one folder take turns instead of
    deleting each other's files, and a prune never deletes the staging folder of a save in
    progress. Readers share it, so they never wait for one another; `latest_checkpoint` takes it
    only for a second look at a folder that failed to verify, and alone for the moment it
    publishes a hidden copy (its first look needs no lock: see there). While it holds the lock,
    a process records `doing` (e.g. "latest_checkpoint"), its pid and its host in
    root/.lock.<random>, a file it keeps locked too: a waiter that gives up names the holders
    from these records, and the next holder removes a record no process holds (its writer was
    killed).

    The locks are flock(2) locks on the open file and die with their process (unless a child it
    forked still holds the file open), so a killed save never blocks the next one. They hold across nodes on NFS (Linux sends flock to the server as a byte-range lock)
    and on Lustre mounted with -o flock; on a filesystem without shared locks, within one node only.
    Raises CheckpointError naming the holders when the lock is not had within `timeout_s` seconds,
    OSError when root/.lock cannot be opened (a folder this process may not write).
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / LOCK, "a+b") as handle:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(handle.fileno(),
                            (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise CheckpointError(
                        _still_held(root, handle.fileno(), shared, timeout_s),
                        path=root / LOCK, fault="locked", timeout_s=timeout_s) from None
                time.sleep(0.05)
        try:
            with _recorded(root, doing, shared):
                yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def held_alone(root: Path | str) -> bool:
    """Whether some process holds root/.lock alone right now (a save, a prune, a recovery or a
    reshard): a shared probe that never waits, and False where there is no lock file."""
    try:
        handle = os.open(Path(root) / LOCK, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(handle)


@contextlib.contextmanager
def _recorded(root: Path, doing: str, shared: bool) -> Iterator[None]:
    """Record this holder of root/.lock in a file of its own, locked, while the body runs.

    First removes the records that no process holds. A record only serves a waiter's message,
    so one that cannot be written (a full disk) is left out and the lock held all the same.
    """
    for path in root.glob(f"{LOCK}.*"):
        _live_record(path)
    path = root / f"{LOCK}.{secrets.token_hex(8)}"
    with contextlib.ExitStack() as stack:
        try:
            record = stack.enter_context(open(path, "xb"))
            stack.callback(path.unlink, missing_ok=True)  # before the file closes and unlocks
            fcntl.flock(record.fileno(), fcntl.LOCK_EX)
            record.write(json.dumps({"doing": doing, "shared": shared, "pid": os.getpid(),
                                     "host": socket.gethostname(), "since": time.time()}).encode())
            record.flush()
        except OSError:
            pass
        yield


def _live_record(path: Path) -> dict | None:
    """The record in `path` while its process holds it ({} if not yet written), else None.

    A record no process holds was left by a killed one: it is removed.
    """
    try:
        with open(path, "rb") as record:
            try:
                fcntl.flock(record.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:  # its writer holds it: alive
                try:
                    return json.loads(record.read())
                except ValueError:
                    return {}
            path.unlink(missing_ok=True)
    except OSError:
        pass  # gone already, or not ours to read: nothing to report or remove
    return None


def _still_held(root: Path, lock: int, shared: bool, timeout_s: float) -> str:
    """The message of a waiter that gave up on root/.lock (open as `lock`): who holds it, and what
    to do."""
    now = time.time()
    records = [record for path in sorted(root.glob(f"{LOCK}.*")) if (record := _live_record(path))]
    holders = [f"{record['doing']} ({'reading' if record['shared'] else 'writing'}, pid "
               f"{record['pid']} on {record['host']}, for {max(0, now - record['since']):.0f} s)"
               for record in records]
    reading = all(record["shared"] for record in records)
    if not records:  # a holder that wrote no record: a shared probe tells readers from a writer
        try:
            fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(lock, fcntl.LOCK_UN)
        except BlockingIOError:
            reading = False
        holders = [f"{'readers' if reading else 'a writer'} that wrote no record"]
    if reading and not shared:
        advice = ("a save waits until every reader of this folder is done; let them finish, or "
                  "stop them, and save again")
    else:
        advice = ("another process is writing into this folder (a save, a recovery or a prune); "
                  "if it belongs to another run, give each run its own folder")
    return f"{root / LOCK} is still held after {timeout_s:.0f} s, by {'; '.join(holders)}: {advice}"
