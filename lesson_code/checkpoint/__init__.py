"""Lesson 80: sharded checkpoints with a manifest, atomic publish and a verified, exact load.

    files.py   bytes on disk: the Disk (atomic writes), sha256, the manifest, the errors
    lock.py    the folder's lock: writers take turns, readers share, a waiter names the holder
    staging.py stage and seal: a checkpoint folder is written hidden and published by one rename
    shards.py  save_sharded / load_sharded: every rank its shard, rank 0 publishes, ranks agree
    flat_state.py  a flat-sharded optimizer state (ZeRO's, as a plain dict) through shards.py;
               consolidate it into torch's formats
    tools.py   latest, list, prune, recover and reshard checkpoints (what a training loop needs)
    faults.py  rank functions that crash saves and loads on purpose, for the lesson and its tests

What the lesson runs (training with checkpoints, resuming, DCP beside ours) is in
`lesson_code.checkpoint_lab`.

    from lesson_code.checkpoint import save_sharded, load_sharded
    save_sharded(root, {"master": shard}, step=10, rank=rank, world_size=4)   # every rank
"""

from lesson_code.checkpoint.files import (DISK, FORMAT_VERSION, MANIFEST, MANIFEST_SHA256,
                                          CheckpointError, Disk, FolderNotSharedError,
                                          FormatVersionError, ManifestDamagedError,
                                          ManifestMissingError, ShardCorruptedError,
                                          ShardMissingError, WorldSizeMismatchError, read_manifest,
                                          read_verified, verify_checkpoint)
from lesson_code.checkpoint.shards import agree, load_sharded, save_sharded, shard_name
from lesson_code.checkpoint.staging import (REPLICATED, publish, recover_step, seal, stage,
                                            staging_folder, step_folder)

__all__ = ["DISK", "FORMAT_VERSION", "MANIFEST", "MANIFEST_SHA256", "REPLICATED", "CheckpointError",
           "Disk", "FolderNotSharedError", "FormatVersionError", "ManifestDamagedError",
           "ManifestMissingError", "ShardCorruptedError", "ShardMissingError",
           "WorldSizeMismatchError", "agree", "load_sharded", "publish", "read_manifest",
           "read_verified", "recover_step", "save_sharded", "seal", "shard_name", "stage",
           "staging_folder", "step_folder", "verify_checkpoint"]
