"""Rank functions that put lesson 80's checkpoints through real faults, for the tests and readers.

Each runs on every rank under `launch.spawn` with real files: small saves, a crash half-way
through a write or between the two renames of a publish, a full disk, two runs saving into one
folder, ranks that see different folders, a trace of the renames and fsyncs each rank makes. A
fault is a `files.Disk` subclass that one rank passes to its save (`disk=`): a crash is a real
SIGKILL of that rank's process, and no module is changed to cause it. A rank reports a
CheckpointError as a value, so a caller sees what every rank raised and how long it took.

    launch.spawn(checkpoint_faults.load_and_report, [folder] * 4, world_size=4)
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist

from lesson_code.checkpoint.files import DISK, CheckpointError, Disk, partial_path
from lesson_code.checkpoint.lock import LOCK
from lesson_code.checkpoint.shards import load_sharded, save_sharded

NUMEL = 1024


class CrashingDisk(Disk):
    """A disk whose first atomic write stops half-way and kills the process (a real SIGKILL).

    It writes the first half of the bytes under the write's temporary name, flushes them to the
    device, and kills its own process: what a power cut or an OOM kill leaves behind.
    """

    def write_atomically(self, path: Path, payload: bytes) -> None:
        with open(partial_path(path), "wb") as handle:
            handle.write(payload[: len(payload) // 2])
            handle.flush()
            self.fsync(handle.fileno())
        os.kill(os.getpid(), signal.SIGKILL)


class FullDisk(Disk):
    """A disk with no space left: every atomic write creates its temporary file, and fails to
    write into it with OSError ENOSPC, as a real full disk does."""

    def write_atomically(self, path: Path, payload: bytes) -> None:
        with open(partial_path(path), "wb"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(partial_path(path)))


class CrashAfterMovingAside(Disk):
    """A disk that kills the process (SIGKILL) right after a rename to a `.replaced` folder:
    between the two renames with which `staging.publish` replaces an older copy of a step."""

    def replace(self, source: Path, destination: Path) -> None:
        super().replace(source, destination)
        if str(destination).endswith(".replaced"):
            os.kill(os.getpid(), signal.SIGKILL)


class TracingDisk(Disk):
    """The real disk, noting each rename and fsync in `events`, in order.

    ("replace", source, destination), or ("fsync", device, inode) of the file or folder.
    """

    def __init__(self):
        self.events: list[tuple] = []

    def replace(self, source: Path, destination: Path) -> None:
        super().replace(source, destination)
        self.events.append(("replace", str(source), str(destination)))

    def fsync(self, handle: int) -> None:
        super().fsync(handle)
        status = os.fstat(handle)
        self.events.append(("fsync", status.st_dev, status.st_ino))


class SnapshotDisk(Disk):
    """The real disk, keeping every state the checkpoint folder passes through during a save.

    Before and after each of the save's own disk steps (a durable write, a rename, a folder
    fsync; not the ones a write makes inside itself) it lists every file and folder under `root`,
    and keeps the list when it differs from the last one: `states[0]` is the folder before the
    save, `states[k]` what a crash after the k-th change would leave on disk. With `copies`, each
    kept state is also copied whole to copies/<k>, real files a test can ask `latest_checkpoint`
    about. Lesson 80's explorer shows these states.
    """

    def __init__(self, root: Path | str, copies: Path | str | None = None):
        self.root, self.copies, self.states, self._depth = Path(root), copies, [], 0
        self._note()

    def _note(self) -> None:
        state = sorted(str(path.relative_to(self.root)) + ("/" if path.is_dir() else "")
                       for path in self.root.rglob("*") if not path.name.startswith(LOCK))
        if self.states and state == self.states[-1]:
            return
        if self.copies is not None:
            shutil.copytree(self.root, Path(self.copies) / str(len(self.states)))
        self.states.append(state)

    def _step(self, action, *args) -> None:
        if self._depth == 0:
            self._note()
        self._depth += 1
        try:
            action(*args)
        finally:
            self._depth -= 1
        if self._depth == 0:
            self._note()

    def write_atomically(self, path: Path, payload: bytes) -> None:
        self._step(super().write_atomically, path, payload)

    def replace(self, source: Path, destination: Path) -> None:
        self._step(super().replace, source, destination)

    def fsync_directory(self, folder: Path) -> None:
        self._step(super().fsync_directory, folder)


def flip_one_byte(path: Path | str) -> None:
    """Flip the lowest bit of the byte in the middle of a file (a silent disk or copy error)."""
    path = Path(path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def save_small(rank: int, world_size: int, root: str, step: int, value: float,
               extra: dict | None = None, numel: int = NUMEL, disk: Disk = DISK) -> str:
    """Save a shard of `numel` copies of `value` (and a replicated tensor) as checkpoint `step`.

    Collective: call on every rank. `disk` does this rank's file operations. Returns the
    published folder.
    """
    shard = {"value": torch.full((numel,), float(value)), "rank": torch.tensor([rank])}
    replicated = {"value": torch.full((4,), float(value))} if rank == 0 else None
    return str(save_sharded(root, shard, step=step, rank=rank, world_size=world_size,
                            replicated=replicated, extra={"value": value, **(extra or {})},
                            disk=disk))


def crash_between_renames(rank: int, world_size: int, root: str) -> None:
    """Save steps 2 and 4, then save step 4 again (value 4.5) and kill rank 0 mid-publish.

    Collective: call on every rank; never returns normally. Rank 0 dies (a real SIGKILL) right
    after moving the old step-4 folder aside and before renaming the new one into its place.
    """
    save_small(rank, world_size, root, 2, 2.0)
    save_small(rank, world_size, root, 4, 4.0)
    save_small(rank, world_size, root, 4, 4.5, disk=CrashAfterMovingAside() if rank == 0 else DISK)


def crash_while_writing(rank: int, world_size: int, root: str, step: int, value: float,
                        crash_rank: int) -> None:
    """Save checkpoint `step`, but `crash_rank` dies (a real SIGKILL) half-way through its first
    write (its shard; rank 0's first write is the staging folder's owner token).

    Collective: call on every rank; never returns normally.
    """
    save_small(rank, world_size, root, step, value,
               disk=CrashingDisk() if rank == crash_rank else DISK)


def save_repeatedly(rank: int, world_size: int, root: str, value: float, times: int,
                    numel: int, ready_dir: str, runs: int = 2) -> list[tuple[float, float]]:
    """Save checkpoint step 1 (shards full of `value`) `times` times, once `runs` runs are ready.

    Collective. Each run's rank 0 announces itself with a file in `ready_dir` and waits (at most
    120 s) for the other runs' files, so that all runs start saving together. Returns the
    wall-clock (start, end) of each save call, for the caller to check that the runs overlapped.
    """
    if rank == 0:
        (Path(ready_dir) / f"ready-{value}").write_text("")
        deadline = time.monotonic() + 120
        while len(list(Path(ready_dir).iterdir())) < runs:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the other runs never became ready in {ready_dir}")
            time.sleep(0.01)
    dist.barrier()
    spans = []
    for _ in range(times):
        started = time.time()
        save_small(rank, world_size, root, 1, value, numel=numel)
        spans.append((started, time.time()))
    return spans


def load_and_report(rank: int, world_size: int, folders: list[str]) -> dict:
    """Load folders[rank], then join a collective as a real resume would; report the outcome.

    Collective: call on every rank. Returns {"error": "<class>: <message>" or None, "seconds":
    how long load_sharded took on this rank}.
    """
    started = time.perf_counter()
    try:
        load_sharded(folders[rank], rank=rank, world_size=world_size)
    except CheckpointError as error:
        return {"error": f"{type(error).__name__}: {error}",
                "seconds": time.perf_counter() - started}
    seconds = time.perf_counter() - started
    dist.barrier()  # the next collective of a resume (load_zero all-gathers the master shards)
    return {"error": None, "seconds": seconds}


def save_and_report(rank: int, world_size: int, roots: list[str]) -> dict:
    """Save a small checkpoint under roots[rank]; report what this rank raised, and how fast.

    Collective: call on every rank. Giving ranks different roots stands for nodes that do not
    share a filesystem.
    """
    started = time.perf_counter()
    try:
        save_small(rank, world_size, roots[rank], 1, 1.0)
    except CheckpointError as error:
        return {"error": f"{type(error).__name__}: {error}",
                "seconds": time.perf_counter() - started}
    return {"error": None, "seconds": time.perf_counter() - started}


def save_and_trace(rank: int, world_size: int, root: str) -> list[tuple]:
    """Save a small checkpoint, recording this rank's renames and fsyncs in order.

    Collective: call on every rank. The real renames and fsyncs run, through a `TracingDisk`
    that notes each: ("replace", source, destination) or ("fsync", device, inode).
    """
    disk = TracingDisk()
    save_small(rank, world_size, root, 1, 1.0, disk=disk)
    return disk.events


def rank_folder(root: str | Path, node: int) -> str:
    """root/node<node>: a folder standing for one node's local disk."""
    folder = Path(root) / f"node{node}"
    folder.mkdir(parents=True, exist_ok=True)
    return str(folder)


def states_of_a_save(rank: int, world_size: int, root: str,
                     copies: str | None = None) -> list[list[str]]:
    """Save step 1, then record every state of the folder while step 2 is saved (one rank).

    Collective: call on every rank (meant for a world of one, so the states follow one order).
    Returns `SnapshotDisk.states` of the second save (lists of "path" and "folder/"), each also
    copied whole under `copies`/<k> when given.
    """
    save_small(rank, world_size, root, 1, 1.0)
    disk = SnapshotDisk(root, copies)
    save_small(rank, world_size, root, 2, 2.0, disk=disk)
    return disk.states
