"""Sharded checkpoints with a manifest (lesson 80): per-rank files, sha256, atomic publish, exact load.

Each rank writes its own shard file; rank 0 also writes the replicated state and, last, once every
shard is on disk, `manifest.json` (format version, step, world size, and for every file its name,
size, sha256, tensors and layout) with `manifest.sha256`, the sha256 of the manifest's own bytes.
A checkpoint is written into a hidden `.step-XXXXXXXX.tmp` folder and renamed to `step-XXXXXXXX`
only when complete; every file is itself written under a temporary name, fsynced and renamed, and
each rank fsyncs the folder of its own renames. So a process killed half-way leaves the previous
checkpoints untouched and the broken one unpublished. Rank 0 holds `root/.lock` while it saves, so
two runs saving into one folder take turns. The ranks agree at each stage: when one rank cannot
see the folder or finds a damaged file, every rank raises the same CheckpointError, at once.
Loading returns the saved tensors bit for bit. This module knows files, hashes and tensors: it
stores what it is given (it knows nothing of ZeRO) and is told rank and world size. The folder
must be the same for every rank: on several nodes, a shared filesystem.

    save_sharded(root, {"master": shard}, step=10, rank=rank, world_size=4)   # every rank
    tensors, meta, manifest = load_sharded(root / "step-00000010", rank=rank, world_size=4)
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from lesson_code.checkpoint.files import (
    DISK, MANIFEST, CheckpointError, Disk, FolderNotSharedError, FormatVersionError,
    ManifestDamagedError, ManifestMissingError, ShardCorruptedError, ShardMissingError,
    WorldSizeMismatchError, manifest_fingerprint, read_manifest, read_verified, write_file)
from lesson_code.checkpoint.lock import LOCK_TIMEOUT_S, locked
from lesson_code.checkpoint.staging import (REPLICATED, recover_step, seal, stage,
                                            staging_folder, step_folder)
from lesson_code.harness.validate import require_positive_int

OWNER = ".owner"  # in a staging folder while its save runs: proves a rank sees rank 0's folder
SHARED_FOLDER_HINT = ("every rank must see the same folder: use a shared filesystem (NFS, Lustre, "
                      "...) mounted at the same path on every node")
ERRORS = {error.__name__: error for error in (
    CheckpointError, FolderNotSharedError, FormatVersionError, ManifestDamagedError,
    ManifestMissingError, ShardCorruptedError, ShardMissingError, WorldSizeMismatchError,
    TypeError)}


def save_sharded(root: Path | str, shard: dict[str, torch.Tensor], *, step: int, rank: int,
                 world_size: int, layout: dict | None = None,
                 replicated: dict[str, torch.Tensor] | None = None,
                 extra: dict | None = None, group=None, disk: Disk = DISK,
                 lock_timeout_s: float = LOCK_TIMEOUT_S) -> Path:
    """Write this rank's `shard`, and on rank 0 `replicated` and the manifest; publish.

    Collective over `group`; `root` is a folder every rank sees. `layout` and `extra` are JSON
    (rank 0's `extra` is kept). Rank 0 holds root/.lock from prepare to publish, waiting at most
    `lock_timeout_s` (and half the group's timeout) for it. Returns root/step-XXXXXXXX. A rank or
    world size that does not fit the group raises ValueError; a failure on any rank raises the
    same CheckpointError (or TypeError for an `extra` that is not JSON) on every rank.
    """
    _check_rank(rank, world_size, group)
    lock_timeout_s = min(lock_timeout_s, collective_timeout_s(group) / 2)
    final = step_folder(root, step)
    staging = staging_folder(final)
    # rank 0's _begin enters root/.lock into `held`; it is released when this block ends
    with contextlib.ExitStack() as held:
        began, failure = None, None
        if rank == 0:
            began, failure = _attempt(lambda: _begin(final, extra, held, disk, lock_timeout_s),
                                      "prepare", final.parent)
        began, verdict = _gather((began, _verdict(failure)), group)[0]
        _raise_agreed([verdict], failure)
        try:
            entry, failure = _attempt(lambda: _write_shard(staging, began, shard, rank,
                                                           world_size, layout, disk),
                                      "write", staging)
            entries = _gather((entry, _verdict(failure)), group)
            _raise_agreed([verdict for _, verdict in entries], failure)
            failure = None
            if rank == 0:
                files = [entry for entry, _ in entries]
                _, failure = _attempt(lambda: _finish(staging, final, files, replicated, disk,
                                                      step=step, world_size=world_size,
                                                      extra=extra or {}), "publish", staging)
            agree(failure, group)
        except (CheckpointError, TypeError):
            if rank == 0:
                shutil.rmtree(staging, ignore_errors=True)  # ours, and never to be published
            raise
    return final


def _begin(final: Path, extra: dict | None, lock: contextlib.ExitStack, disk: Disk,
           lock_timeout_s: float) -> tuple[str, str]:
    """Rank 0: take the folder's lock, recover this step's unpublished copy, create staging.

    A staging folder it created is removed again if writing the token there fails (a full disk).
    Returns (a random token written into staging, the staging path), for the other ranks to check
    that they see the very folder rank 0 created.
    """
    json.dumps(extra or {})  # TypeError now rather than after every shard is written
    lock.enter_context(locked(final.parent, f"save_sharded of {final.name}",
                              timeout_s=lock_timeout_s))
    recover_step(final, disk)
    staging = stage(final, disk)
    token = secrets.token_hex(16)
    try:
        disk.write_atomically(staging / OWNER, token.encode())
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # ours, and never to be published
        raise
    return token, str(staging)


def _write_shard(staging: Path, began: tuple[str, str], shard: dict, rank: int, world_size: int,
                 layout: dict | None, disk: Disk) -> dict:
    """Check this rank sees rank 0's staging folder, then write its shard there; its entry."""
    token, zero_sees = began
    try:
        seen = (staging / OWNER).read_text()
    except OSError:
        seen = None
    if seen != token:
        raise FolderNotSharedError(
            f"rank 0 created {zero_sees} for this save but rank {rank} does not see it (it looked "
            f"in {staging}): {SHARED_FOLDER_HINT}", path=zero_sees, fault="staging_not_seen",
            rank=rank)
    entry = write_file(staging, shard_name(rank, world_size), shard, disk)
    return {**entry, "rank": rank, "layout": layout or {}}


def _finish(staging: Path, final: Path, files: list, replicated: dict | None, disk: Disk,
            **manifest) -> None:
    """Rank 0, once every shard is on disk: drop the owner token, then `staging.seal`."""
    (staging / OWNER).unlink()
    seal(staging, final, files, replicated=replicated, disk=disk, **manifest)


def flat_layout(numel: int, start: int, length: int) -> dict:
    """The layout of a shard that holds elements [start, start + length) of a flat vector of
    `numel` real elements, padded at its end to split evenly: "padding" counts this shard's own
    padding elements (the last shard's, where the run's padding sits; 0 elsewhere)."""
    return {"numel": numel, "start": start, "length": length,
            "padding": max(0, min(length, start + length - numel))}


def join_flat(shards: list[dict], key: str, numel: int, padded_to: int | None = None) -> torch.Tensor:
    """The flat vector `key` whole, from `shards` (the ranks' loaded shard dicts, in rank order):
    its `numel` real elements, then zeros up to `padded_to` elements if given.

    Takes each rank's slice out of its dict as it copies it in, so that the slices are freed as
    the whole fills: the shards and the whole together hold about one copy of the vector, where
    a concatenation would hold two.
    """
    whole = torch.empty(padded_to or numel, dtype=shards[0][key].dtype)
    offset = 0
    for shard in shards:
        piece = shard.pop(key)
        count = max(0, min(piece.numel(), numel - offset))
        whole[offset: offset + count] = piece[:count]
        offset += count
        del piece  # the slice's memory goes now, not when the loop ends
    whole[offset:] = 0
    return whole


def shard_name(rank: int, world_size: int) -> str:
    """File name of rank `rank`'s shard: shard-00001-of-00004.pt."""
    return f"shard-{rank:05d}-of-{world_size:05d}.pt"


def load_sharded(folder: Path | str, *, rank: int, world_size: int, replicated: bool = True,
                 group=None) -> tuple[dict, dict, dict]:
    """This rank's shard tensors, the replicated tensors and the manifest, all verified.

    Collective when a process group is initialised: call on every rank. The ranks first check
    that they all see the same manifest, then each verifies the files it reads, then they agree:
    if any rank found a problem, every rank raises the same error naming the file, so no rank
    goes on into a collective the others never join. Without a process group (one process
    looking at a checkpoint) it checks this rank's files alone. Raises the CheckpointError
    subclasses, e.g. FolderNotSharedError when the ranks see different folders, ShardCorruptedError
    for a changed byte, WorldSizeMismatchError for another number of ranks (with the hint to
    reshard).
    """
    folder = Path(folder)
    together = dist.is_available() and dist.is_initialized()
    if together:
        _check_same_checkpoint(folder, group)
    loaded, failure = _attempt(lambda: _read_rank(folder, rank, world_size, replicated), "read",
                               folder)
    if together:
        agree(failure, group)
    elif failure is not None:
        raise failure
    return loaded


def _read_rank(folder: Path, rank: int, world_size: int, replicated: bool) -> tuple:
    manifest = read_manifest(folder)
    if manifest["world_size"] != world_size:
        call = f"reshard({str(folder)!r}, dst, {world_size})"  # the fix, in both languages
        raise WorldSizeMismatchError(
            f"{folder / MANIFEST} was saved by {manifest['world_size']} ranks, but world_size is "
            f"{world_size}: reshard it first, e.g. {call}",
            path=folder / MANIFEST, fault="world_size", saved=manifest["world_size"],
            world_size=world_size, call=call)
    entries = {entry["name"]: entry for entry in manifest["files"]}
    shard = read_verified(folder, entries[shard_name(rank, world_size)])
    both = read_verified(folder, entries[REPLICATED]) if replicated and REPLICATED in entries else {}
    return shard, both, manifest


def _check_same_checkpoint(folder: Path, group) -> None:
    """Collective: raise FolderNotSharedError on every rank unless all see the same manifest.

    A rank that cannot read its manifest.json (permissions, an I/O error) makes every rank raise
    that error instead, with the file's path.
    """
    fingerprint, failure = _attempt(lambda: manifest_fingerprint(folder), "read",
                                    folder / MANIFEST)
    seen = _gather((str(folder), fingerprint, _verdict(failure)), group)
    _raise_agreed([verdict for _, _, verdict in seen], failure)
    if len({fingerprint for _, fingerprint, _ in seen}) == 1:
        return  # the same manifest everywhere, or none anywhere (ManifestMissingError follows)
    views: dict[str | None, list[int]] = {}
    for rank, (_, fingerprint, _) in enumerate(seen):
        views.setdefault(fingerprint, []).append(rank)
    described = "; ".join(
        f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} "
        + (f"see{'' if len(ranks) > 1 else 's'} a manifest with sha256 {fingerprint[:12]}..."
           if fingerprint else f"see{'' if len(ranks) > 1 else 's'} no {MANIFEST}")
        for fingerprint, ranks in views.items())
    raise FolderNotSharedError(f"the ranks do not see the same checkpoint in {seen[0][0]} "
                               f"({described}): {SHARED_FOLDER_HINT}", path=seen[0][0],
                               fault="different_views")


def agree(failure: BaseException | None, group=None) -> None:
    """Raise on every rank the first rank's error if any rank had one; else return.

    Collective: call on every rank, each with its own outcome (None when it went well). The
    error keeps its class and message and says which ranks found it, so every rank raises the
    same thing at the same moment instead of some waiting in the next collective until timeout.
    """
    _raise_agreed(_gather(_verdict(failure), group), failure)


def _raise_agreed(verdicts: list, failure: BaseException | None) -> None:
    failed = [rank for rank, verdict in enumerate(verdicts) if verdict is not None]
    if not failed:
        return
    name, message, facts = verdicts[failed[0]]
    found = f"rank{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))}"
    error = ERRORS.get(name, CheckpointError)
    if not issubclass(error, CheckpointError):
        raise error(f"{message} [found by {found}]") from failure
    raise error(f"{message} [found by {found}]", **facts, found_by=failed) from failure


def _verdict(failure: BaseException | None) -> tuple[str, str, dict] | None:
    """What the other ranks need to raise `failure` too: its class's name, its message, and
    (a CheckpointError's) path, fault and facts."""
    if failure is None:
        return None
    facts = ({"path": failure.path, "fault": failure.fault, **failure.facts}
             if isinstance(failure, CheckpointError) else {})
    return type(failure).__name__, str(failure), facts


def collective_timeout_s(group=None) -> float:
    """How many seconds a collective of `group` (default: the default group) waits before it
    gives up: the `timeout` its process group was created with (by default 10 minutes on NCCL,
    30 on gloo). Read from the backend's options, torch's own record of it; where a backend
    keeps none, NCCL's default, the shorter."""
    group = group or dist.group.WORLD
    device = torch.device("cuda" if dist.get_backend(group) == "nccl" else "cpu")
    try:
        return group._get_backend(device).options._timeout.total_seconds()
    except (AttributeError, RuntimeError):
        return 600.0


def _gather(value: Any, group) -> list:
    values: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(values, value, group=group)
    return values


def _attempt(action: Callable[[], Any], what: str, path: Path) -> tuple[Any, Exception | None]:
    """Run `action`; return (its result, None), or (None, the error) for the ranks to agree on."""
    try:
        return action(), None
    except (CheckpointError, TypeError) as error:
        return None, error
    except OSError as error:
        return None, CheckpointError(f"could not {what} {path}: {error}; check the disk (space, "
                                     f"permissions) and that every rank sees {path.parent}",
                                     path=path, fault="io", reason=str(error))
    except Exception as error:  # noqa: BLE001 - any failure must reach the other ranks' agreement
        return None, CheckpointError(f"could not {what} {path}: {type(error).__name__}: {error}",
                                     path=path, fault="io", reason=f"{type(error).__name__}: {error}")


def _check_rank(rank: int, world_size: Any, group) -> None:
    require_positive_int("world_size", world_size, "the number of ranks that save, such as 4")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int in 0..{world_size - 1}, got {rank!r}: pass this "
                         "process's rank in the group")
    actual = dist.get_world_size(group)
    if actual != world_size:
        raise ValueError(f"world_size={world_size} but the process group has {actual} ranks: "
                         "pass the group's size (every rank saves one shard)")
    claimed = _gather(rank, group)  # every rank sees every claim, so all raise alike or none
    if claimed != list(range(world_size)):
        wrong = ", ".join(f"rank {actual} passed rank={given}" for actual, given
                          in enumerate(claimed) if given != actual)
        raise ValueError(f"each process must pass its own rank in the group ({wrong}): two "
                         "shards would share a file, or none would write the manifest; pass "
                         "dist.get_rank(group)")
