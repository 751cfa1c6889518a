"""Stage, then publish (lesson 80): how a checkpoint folder appears complete or not at all.

A checkpoint of step N is written into a hidden folder `.step-0000000N.tmp`; when every file is
there, the manifest is written last and one rename publishes the folder as `step-0000000N`. The
collective save (`shards.save_sharded`) and the one-process rewrite (`tools.reshard`) both go
through `stage` and `seal` here, so a checkpoint is published in exactly one way. One process,
no process group; call these with the root's lock held (`lock.locked`).

    staging = stage(final)                       # an empty .step-N.tmp
    ...write the shards into staging...
    seal(staging, final, files, step=N, world_size=4, extra={})   # manifest, then publish
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from lesson_code.checkpoint.files import (DISK, FORMAT_VERSION, CheckpointError, Disk,
                                          verify_checkpoint, versions, write_file, write_manifest)

REPLICATED = "replicated.pt"


def step_folder(root: Path | str, step: int) -> Path:
    """Where the checkpoint of `step` lives under `root`: root/step-00000010."""
    return Path(root) / f"step-{step:08d}"


def staging_folder(final: Path) -> Path:
    """Where the save of `final` is written before it is published: root/.step-00000010.tmp."""
    return final.with_name(f".{final.name}.tmp")


def aside_folder(final: Path) -> Path:
    """Where `publish` moves an older copy of the same step for a moment: .step-00000010.replaced."""
    return final.with_name(f".{final.name}.replaced")


def deleting_folder(final: Path) -> Path:
    """Where a prune moves a published checkpoint before deleting it: .step-00000010.deleting."""
    return final.with_name(f".{final.name}.deleting")


def stage(final: Path, disk: Disk = DISK) -> Path:
    """Create an empty staging folder for `final` (an interrupted attempt's is removed); return it."""
    staging = staging_folder(final)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    disk.fsync_directory(final.parent)
    return staging


def seal(staging: Path, final: Path, files: list[dict], *, step: int, world_size: int,
         extra: dict, replicated: dict[str, torch.Tensor] | None = None,
         disk: Disk = DISK) -> None:
    """Finish a staged checkpoint: the replicated file, then the manifest, then `publish`.

    `files` are the manifest entries of the shards already in `staging`. manifest.json and then
    manifest.sha256 are written only now, when every file listed is on disk; a manifest is trusted
    only once it matches manifest.sha256, so the save commits when that file, the last, lands.
    """
    if replicated is not None:
        files = [*files, {**write_file(staging, REPLICATED, replicated, disk), "rank": None,
                          "layout": {}}]
    write_manifest(staging, {"format_version": FORMAT_VERSION, "step": step,
                             "world_size": world_size, "extra": extra, "versions": versions(),
                             "files": files}, disk)
    publish(staging, final, disk)


def publish(staging: Path, final: Path, disk: Disk = DISK) -> None:
    """Rename a complete staging folder to its final name: the one step that publishes it.

    An existing checkpoint of the same step is first moved aside and deleted only afterwards, so
    at every moment one complete copy exists under some name; a crash between the two renames
    leaves both copies hidden, and `recover_step` publishes one.
    """
    aside = aside_folder(final)
    if final.exists():
        shutil.rmtree(aside, ignore_errors=True)
        disk.replace(final, aside)
        disk.fsync_directory(final.parent)
    disk.replace(staging, final)
    disk.fsync_directory(final.parent)
    shutil.rmtree(aside, ignore_errors=True)


def recover_step(final: Path, disk: Disk = DISK, *, hashes: bool = True) -> Path | None:
    """Publish the complete hidden copy of a step that has no folder; return it, else None.

    A save stopped between the two renames of `publish` leaves its new copy in .step-N.tmp and
    the old one in .step-N.replaced; the newer of those that verifies (every file's size and
    sha256; with `hashes=False` the manifest and the sizes only, no file read) gets the name step-N.
    """
    if final.exists():
        return None
    for copy in (staging_folder(final), aside_folder(final)):
        try:
            verify_checkpoint(copy, hashes=hashes)
        except CheckpointError:
            continue
        disk.replace(copy, final)
        disk.fsync_directory(final.parent)
        return final
    return None
