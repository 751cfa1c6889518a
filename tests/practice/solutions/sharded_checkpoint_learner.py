"""A learner's lesson 80 file, written as a learner would: a sharded save and a verified load.

Each rank writes its shard into a hidden staging folder, rank 0 writes the manifest (sizes and
sha256) once every shard is there and publishes the folder with one rename; the load checks the
world size and each file's size and sha256 before torch.load. The practice tests grade it as it
is (every check passes) and with one mistake each (tests/practice/test_sharded_checkpoint.py).
"""

import hashlib
import io
import json
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

REPLICATED = "replicated.pt"


def shard_name(rank, world_size):
    return f"shard-{rank:05d}-of-{world_size:05d}.pt"


def step_folder(root, step):
    return Path(root) / f"step-{step:08d}"


def _write(path, tensors):
    """torch.save `tensors` to `path` through a temporary file and a rename; its manifest entry."""
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    payload = buffer.getvalue()
    temporary = path.with_name(f".{path.name}.partial")
    with open(temporary, "wb") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    return {"name": path.name, "bytes": len(payload),
            "sha256": hashlib.sha256(payload).hexdigest()}


def _publish(staging, final):
    """Rename the complete staging folder to `final`; an older copy of the step goes aside first."""
    if final.exists():
        aside = final.with_name(f".{final.name}.old")
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(final, aside)
        os.replace(staging, final)
        shutil.rmtree(aside)
    else:
        os.replace(staging, final)


def save_sharded(root, shard, *, step, rank, world_size, layout=None, replicated=None,
                 extra=None, group=None):
    final = step_folder(root, step)
    staging = final.with_name(f".{final.name}.tmp")
    if rank == 0:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    dist.barrier(group)
    entry = _write(staging / shard_name(rank, world_size), shard)
    entries = [None] * world_size
    dist.all_gather_object(entries, {**entry, "rank": rank, "layout": layout or {}}, group=group)
    if rank == 0:
        if replicated is not None:
            entries.append({**_write(staging / REPLICATED, replicated), "rank": None, "layout": {}})
        manifest = {"step": step, "world_size": world_size, "extra": extra or {},
                    "files": entries}
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=1))
        _publish(staging, final)
    dist.barrier(group)
    return final


def _read(folder, entry):
    payload = (folder / entry["name"]).read_bytes()
    if len(payload) != entry["bytes"]:
        raise ValueError(f"{folder / entry['name']} has {len(payload)} bytes, the manifest says "
                         f"{entry['bytes']}")
    if hashlib.sha256(payload).hexdigest() != entry["sha256"]:
        raise ValueError(f"{folder / entry['name']} does not match its sha256 in the manifest")
    return torch.load(io.BytesIO(payload), weights_only=True)


def load_sharded(folder, *, rank, world_size, replicated=True, group=None):
    folder = Path(folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    if manifest["world_size"] != world_size:
        raise ValueError(f"{folder} was saved by {manifest['world_size']} ranks, not {world_size}")
    entries = {entry["name"]: entry for entry in manifest["files"]}
    shard = _read(folder, entries[shard_name(rank, world_size)])
    both = _read(folder, entries[REPLICATED]) if replicated and REPLICATED in entries else {}
    return shard, both, manifest
