"""Sharded checkpoints with a manifest (lesson 80): per-rank files, sha256, atomic publish, exact load.

Each rank writes its own shard file; rank 0 also writes the replicated state and, last, once every
shard is on disk, `manifest.json`: format version, step, world size, and for every file its name,
size, sha256, tensors (dtype, shape) and layout (which elements of which flat vector it holds).
A checkpoint is written into a hidden `.step-XXXXXXXX.tmp` folder and renamed to `step-XXXXXXXX`
only when complete, every file itself written under a temporary name, fsynced and renamed; so a
process killed half-way leaves the previous checkpoints untouched and the broken one unpublished.
Loading checks the manifest and the sha256 of every file it reads, and returns the saved tensors
bit for bit. This module knows files, hashes and tensors: it stores what it is given (it knows
nothing of ZeRO) and is told rank and world size.

    save_sharded(root, {"master": shard}, step=10, rank=rank, world_size=4)   # every rank
    tensors, meta, manifest = load_sharded(root / "step-00000010", rank=rank, world_size=4)
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
REPLICATED = "replicated.pt"


class CheckpointError(Exception):
    """Base of every error a checkpoint can raise; each names the file and what is wrong."""


class ManifestMissingError(CheckpointError):
    """No manifest.json: the folder is not a complete checkpoint (perhaps an interrupted save)."""


class ManifestTamperedError(CheckpointError):
    """manifest.json does not match its own checksum: it was edited or damaged."""


class FormatVersionError(CheckpointError):
    """The manifest's format version is one this code does not read."""


class WorldSizeMismatchError(CheckpointError):
    """The checkpoint was saved by another number of ranks."""


class ShardMissingError(CheckpointError):
    """A file the manifest lists is not there."""


class ShardCorruptedError(CheckpointError):
    """A file's size or sha256 differs from the manifest's (truncated, or bytes changed)."""


def step_folder(root: Path | str, step: int) -> Path:
    """Where the checkpoint of `step` lives under `root`: root/step-00000010."""
    return Path(root) / f"step-{step:08d}"


def save_sharded(root: Path | str, shard: dict[str, torch.Tensor], *, step: int, rank: int,
                 world_size: int, layout: dict | None = None,
                 replicated: dict[str, torch.Tensor] | None = None,
                 extra: dict | None = None, group=None) -> Path:
    """Write this rank's `shard` tensors, and on rank 0 `replicated` and the manifest; publish.

    Collective: call on every rank of a group of `world_size` ranks (gloo or NCCL), each with its
    own shard. `layout` (JSON) describes the shard, e.g. {"numel": P, "start": s, "length": n,
    "padding": p} for a slice of a flat vector; `extra` (JSON, rank 0's is kept) holds what else a
    resume needs, such as the data position. Returns the published folder root/step-XXXXXXXX.
    Raises ValueError for a rank outside the world, or a world size that differs from the group's.
    """
    _check_rank(rank, world_size, group)
    final = step_folder(root, step)
    staging = final.with_name(f".{final.name}.tmp")
    if rank == 0:
        shutil.rmtree(staging, ignore_errors=True)  # a previous interrupted attempt at this step
        staging.mkdir(parents=True)
    dist.barrier(group=group)
    entry = write_file(staging, shard_name(rank, world_size), shard)
    entry.update({"rank": rank, "layout": layout or {}})
    entries: list = [None] * world_size
    dist.all_gather_object(entries, entry, group=group)  # returns once every shard is on disk
    if rank == 0:
        files = list(entries)
        if replicated is not None:
            files.append({**write_file(staging, REPLICATED, replicated), "rank": None,
                          "layout": {}})
        write_manifest(staging, {"format_version": FORMAT_VERSION, "step": step,
                                  "world_size": world_size, "files": files,
                                  "extra": extra or {}, "versions": versions()})
        publish(staging, final)
    dist.barrier(group=group)
    return final


def publish(staging: Path, final: Path) -> None:
    """Rename a complete staging folder to its final name: the one step that publishes it.

    An existing checkpoint of the same step is first moved aside and deleted only afterwards, so
    at every moment one complete copy exists under some name.
    """
    aside = final.with_name(f".{final.name}.replaced")
    if final.exists():
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(final, aside)
    os.replace(staging, final)
    _fsync_directory(final.parent)
    shutil.rmtree(aside, ignore_errors=True)


def shard_name(rank: int, world_size: int) -> str:
    """File name of rank `rank`'s shard: shard-00001-of-00004.pt."""
    return f"shard-{rank:05d}-of-{world_size:05d}.pt"


def read_manifest(folder: Path | str) -> dict:
    """The manifest of the checkpoint in `folder`, after checking its checksum and version.

    Raises ManifestMissingError, ManifestTamperedError or FormatVersionError, naming the file.
    """
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise ManifestMissingError(
            f"{path} does not exist: {Path(folder).name} is not a complete checkpoint (a save that "
            "was interrupted never writes it); load an earlier step, see latest_checkpoint()")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ManifestTamperedError(f"{path} is not valid JSON ({error})") from error
    recorded = manifest.pop("manifest_sha256", None)
    if recorded != _canonical_sha256(manifest):
        raise ManifestTamperedError(
            f"{path} does not match its own checksum: it was edited by hand or damaged; "
            "restore it from the saving run, or load an earlier checkpoint")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise FormatVersionError(
            f"{path} has format version {manifest.get('format_version')!r}; this code reads "
            f"version {FORMAT_VERSION}: load it with the lesson_code version that wrote it")
    return manifest


def load_sharded(folder: Path | str, *, rank: int, world_size: int,
                 replicated: bool = True) -> tuple[dict, dict, dict]:
    """This rank's shard tensors, the replicated tensors and the manifest, all verified.

    Not a collective: each rank reads its own file (and, with `replicated`, the replicated one).
    Raises the CheckpointError subclasses above, e.g. WorldSizeMismatchError for a checkpoint
    written by another number of ranks (with the hint to reshard it).
    """
    folder = Path(folder)
    manifest = read_manifest(folder)
    if manifest["world_size"] != world_size:
        raise WorldSizeMismatchError(
            f"{folder / MANIFEST} was saved by {manifest['world_size']} ranks, but world_size is "
            f"{world_size}: reshard it first, e.g. reshard({str(folder)!r}, dst, {world_size})")
    entries = {entry["name"]: entry for entry in manifest["files"]}
    shard = read_verified(folder, entries[shard_name(rank, world_size)])
    both = read_verified(folder, entries[REPLICATED]) if replicated and REPLICATED in entries else {}
    return shard, both, manifest


def read_verified(folder: Path, entry: dict) -> dict[str, torch.Tensor]:
    """Load one file after checking it exists and that its size and sha256 match the manifest."""
    path = Path(folder) / entry["name"]
    if not path.is_file():
        raise ShardMissingError(f"{path} is listed in the manifest but missing: the checkpoint is "
                                "incomplete; restore the file or load another checkpoint")
    payload = path.read_bytes()
    if len(payload) != entry["bytes"]:
        raise ShardCorruptedError(f"{path} is {len(payload)} bytes but the manifest says "
                                  f"{entry['bytes']}: the file was truncated or overwritten")
    digest = hashlib.sha256(payload).hexdigest()
    if digest != entry["sha256"]:
        raise ShardCorruptedError(f"{path} has sha256 {digest[:16]}..., the manifest "
                                  f"{entry['sha256'][:16]}...: its bytes changed since the save")
    return torch.load(io.BytesIO(payload), weights_only=True)


def write_file(folder: Path, name: str, tensors: dict[str, torch.Tensor]) -> dict:
    """Serialise `tensors` to folder/name atomically; return its manifest entry."""
    buffer = io.BytesIO()
    torch.save({key: value.detach().cpu().contiguous() for key, value in tensors.items()}, buffer)
    payload = buffer.getvalue()
    write_atomically(folder / name, payload)
    return {"name": name, "bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest(),
            "tensors": {key: {"dtype": str(value.dtype).removeprefix("torch."),
                              "shape": list(value.shape)} for key, value in tensors.items()}}


def write_atomically(path: Path, payload: bytes) -> None:
    """Write `payload` to `path` so that `path` is either absent or complete, never half-written.

    The bytes go to a temporary file in the same folder, are flushed and fsynced, and the file is
    renamed over `path` (os.replace is atomic on POSIX and Windows).
    """
    temporary = path.with_name(f".{path.name}.{os.getpid()}.partial")
    with open(temporary, "wb") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def write_manifest(folder: Path, manifest: dict) -> None:
    """Write manifest.json atomically, with a checksum of its own content, and fsync the folder."""
    content = {**manifest, "manifest_sha256": _canonical_sha256(manifest)}
    write_atomically(folder / MANIFEST, (json.dumps(content, indent=2, sort_keys=True) + "\n").encode())
    _fsync_directory(folder)


def _canonical_sha256(manifest: dict) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _fsync_directory(folder: Path) -> None:
    """Make a rename inside `folder` durable (POSIX; a no-op where folders cannot be opened)."""
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def versions() -> dict[str, str]:
    """Versions of the libraries that wrote a checkpoint (recorded in its manifest)."""
    from lesson_code import __version__
    return {"torch": torch.__version__, "python": platform.python_version(),
            "lesson_code": __version__}


def _check_rank(rank: int, world_size: Any, group) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank!r} is not in 0..{world_size - 1}")
    actual = dist.get_world_size(group)
    if actual != world_size:
        raise ValueError(f"world_size={world_size} but the process group has {actual} ranks: "
                         "pass the group's size (every rank saves one shard)")
