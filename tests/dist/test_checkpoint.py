"""Lesson 80: sharded checkpoints on real ranks: exact resume, crash safety, every corruption named."""

import hashlib
import json
import shutil

import pytest
import torch
import torch.distributed as dist

from lesson_code import checkpoint, checkpoint_exercises, checkpoint_lab, launch
from lesson_code.checkpoint import load_sharded, step_folder
from lesson_code.checkpoint.faults import flip_one_byte
from lesson_code.checkpoint.tools import (CheckpointPolicy, latest_checkpoint, list_checkpoints,
                                          prune_checkpoints, reshard)
from lesson_code.checkpoint.flat_state import consolidate
from lesson_code.experiment import flat_parameters
from lesson_code.models import build_model
from lesson_code.harness.reference import in_one_rank
from lesson_code.zero_lab import ZeroRun, run_loss, train_single_process

RUN = ZeroRun(steps=20)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A 20-step run on 4 ranks that saved after steps 10 and 15."""
    root = tmp_path_factory.mktemp("ckpt")
    results = launch.spawn(checkpoint_lab.train_with_checkpoints, RUN, str(root), [10, 15],
                           world_size=4)
    return root, results


def test_manifest_records_layout_hashes_and_versions(saved):
    root, _ = saved
    manifest = json.loads((step_folder(root, 10) / "manifest.json").read_text())
    assert manifest["format_version"] == checkpoint.FORMAT_VERSION and manifest["step"] == 10 and manifest["world_size"] == 4
    shards = [f for f in manifest["files"] if f["rank"] is not None]
    assert [f["layout"]["start"] for f in shards] == [0, 1731, 3462, 5193]
    # Each shard's own padding: ZeRO's 2 zeros sit at the end of the last shard only.
    assert [f["layout"]["padding"] for f in shards] == [0, 0, 0, 2]
    assert all(f["layout"]["numel"] == 6922 for f in shards)
    assert all(len(f["sha256"]) == 64 and f["bytes"] > 0 for f in manifest["files"])
    assert shards[0]["tensors"]["master"] == {"dtype": "float32", "shape": [1731]}
    assert manifest["extra"]["next_step"] == 10 and manifest["extra"]["optimizer_step"] == 10
    assert manifest["versions"]["torch"].startswith("2.13.0")


def test_resuming_at_step_10_reproduces_the_run_that_never_stopped_and_drifts_without_the_step(saved):
    root, straight = saved
    resumed = launch.spawn(checkpoint_lab.resume_training, RUN, str(step_folder(root, 10)),
                           world_size=4)
    for a, b in zip(straight, resumed):
        assert torch.equal(a["params"], b["params"])
        assert a["losses"][10:] == b["losses"]
        # ranks built from other seeds: only the checkpoint can give back the random stream
        assert torch.equal(a["rng_state"], b["rng_state"])
    forgot = launch.spawn(checkpoint_lab.resume_training, RUN, str(step_folder(root, 10)), True,
                          world_size=4)  # Adam's step count is part of the state: without it, drift
    assert forgot[0]["losses"][0] == straight[0]["losses"][10]  # step 11 comes before an update
    assert forgot[0]["losses"][1] != straight[0]["losses"][11]
    assert not torch.equal(forgot[0]["params"], straight[0]["params"])


def test_a_save_in_the_background_writes_the_same_bytes_as_a_blocking_one(saved, tmp_path):
    root, straight = saved
    results = launch.spawn(checkpoint_lab.train_with_checkpoints, RUN, str(tmp_path), [10, 15],
                           checkpoint_exercises.BackgroundSaver, world_size=4)
    for step in (10, 15):  # the manifest lists every file's sha256: equal manifests, equal files
        assert ((step_folder(tmp_path, step) / "manifest.sha256").read_bytes()
                == (step_folder(root, step) / "manifest.sha256").read_bytes())
    assert [r["losses"] for r in results] == [r["losses"] for r in straight]
    assert all(sorted(r["blocked_s"]) == [10, 15] for r in results)
    for r in results:  # the wait for the save before is part of the hold-up; the first has none
        assert r["waited_s"][10] < 0.05 and 0 <= r["waited_s"][15] <= r["blocked_s"][15]
        assert r["run_s"] >= sum(r["blocked_s"].values())
    assert all(r["waited_s"] == {} for r in straight)  # a blocking save waits for nothing


def save_unwritable_in_the_background(rank, world_size, root):
    """A background save whose `extra` JSON cannot hold: its error reaches every rank's wait()."""
    from lesson_code.zero_lab import build_optimizer, run_model
    model, optimizer = build_optimizer(RUN, run_model(RUN), rank, world_size)
    saver = checkpoint_exercises.BackgroundSaver(root, model, optimizer)
    saver.save(1, extra={"not JSON": {1, 2}})
    try:
        saver.wait()
    except TypeError as error:
        return str(error)
    return None


def test_a_background_save_that_fails_raises_on_every_rank_when_waited_for(tmp_path):
    messages = launch.spawn(save_unwritable_in_the_background, str(tmp_path), world_size=2,
                            timeout_s=60)
    assert messages == ["Object of type set is not JSON serializable [found by rank 0]"] * 2
    assert list_checkpoints(tmp_path) == []


def test_save_then_load_is_bit_for_bit(tmp_path):
    checks = launch.spawn(checkpoint_lab.round_trip, ZeroRun(steps=3), str(tmp_path), world_size=3)
    assert all(all(rank.values()) for rank in checks), checks


def test_a_rank_killed_during_a_save_leaves_the_previous_checkpoint_and_a_restart_goes_on(
        saved, tmp_path):
    with pytest.raises(launch.RankCrashedError) as caught:
        launch.spawn(checkpoint_lab.crash_during_save, ZeroRun(), str(tmp_path), 1, world_size=4)
    assert caught.value.rank == 1 and "SIGKILL" in str(caught.value)
    folder, skipped = latest_checkpoint(tmp_path)
    assert folder == step_folder(tmp_path, 2)
    assert skipped == [".step-00000004.tmp: an interrupted save, never published"]
    partial = list((tmp_path / ".step-00000004.tmp").glob(".shard-00001-*.partial"))
    assert partial, "the killed rank left its half-written temporary file"
    assert not (tmp_path / "step-00000004").exists()
    for rank in range(4):
        load_sharded(folder, rank=rank, world_size=4)  # complete and verified
    continued = launch.spawn(checkpoint_exercises.restart_training, ZeroRun(steps=4),
                             str(tmp_path), world_size=4)
    assert [(r["resumed_from"], r["resumed_at"]) for r in continued] == [("step-00000002", 2)] * 4
    assert continued[0]["losses"] == saved[1][0]["losses"][2:4]  # steps 3 and 4, bit for bit


def corrupted_copy(saved, tmp_path, damage):
    root, _ = saved
    folder = tmp_path / "step-00000010"
    shutil.copytree(step_folder(root, 10), folder)
    damage(folder)
    return folder


def edit_manifest(folder, change, rehash=False):
    """Edit manifest.json; with `rehash`, record the new bytes' sha256 as a careful editor would."""
    manifest = json.loads((folder / "manifest.json").read_text())
    change(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    if rehash:
        digest = hashlib.sha256((folder / "manifest.json").read_bytes()).hexdigest()
        (folder / "manifest.sha256").write_text(f"{digest}  manifest.json\n")


CORRUPTIONS = {
    "no manifest": (lambda f: (f / "manifest.json").unlink(), checkpoint.ManifestMissingError,
                    "manifest.json does not exist"),
    "missing shard": (lambda f: (f / "shard-00002-of-00004.pt").unlink(),
                      checkpoint.ShardMissingError, "shard-00002-of-00004.pt is listed"),
    "truncated shard": (lambda f: (f / "shard-00002-of-00004.pt").write_bytes(
        (f / "shard-00002-of-00004.pt").read_bytes()[:1000]), checkpoint.ShardCorruptedError,
        "shard-00002-of-00004.pt is 1000 bytes but the manifest says"),
    "one flipped byte": (lambda f: flip_one_byte(f / "shard-00002-of-00004.pt"),
                         checkpoint.ShardCorruptedError, "its bytes changed since the save"),
    "manifest edited by hand": (lambda f: edit_manifest(f, lambda m: m.update(step=11)),
                                checkpoint.ManifestDamagedError, "manifest.sha256 records"),
    "manifest cut short": (lambda f: (f / "manifest.json").write_bytes(
        (f / "manifest.json").read_bytes()[:100]), checkpoint.ManifestDamagedError, "is damaged"),
    "no manifest.sha256": (lambda f: (f / "manifest.sha256").unlink(),
                           checkpoint.ManifestDamagedError, "manifest.sha256 is missing"),
    "unknown format version": (lambda f: edit_manifest(f, lambda m: m.update(format_version=99),
                                                       rehash=True),
                               checkpoint.FormatVersionError, "has format version 99"),
    # Version 1 kept the manifest's checksum inside it: told its version, not called damaged.
    "format version 1": (lambda f: (edit_manifest(f, lambda m: m.update(format_version=1)),
                                    (f / "manifest.sha256").unlink()),
                         checkpoint.FormatVersionError, "has format version 1"),
}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_every_corruption_gets_its_own_error_naming_the_file(saved, tmp_path, case):
    damage, error, message = CORRUPTIONS[case]
    folder = corrupted_copy(saved, tmp_path, damage)
    with pytest.raises(error, match=message) as caught:
        load_sharded(folder, rank=2, world_size=4)
    assert isinstance(caught.value, checkpoint.CheckpointError)
    assert str(folder) in str(caught.value)


def test_another_world_size_is_refused_with_the_hint_to_reshard(saved):
    root, _ = saved
    with pytest.raises(checkpoint.WorldSizeMismatchError, match="saved by 4 ranks, but world_size is 2: reshard"):
        load_sharded(step_folder(root, 10), rank=0, world_size=2)


def random_streams(folder):
    """What each shard of `folder` holds to start its rank's random stream: its saved RNG state,
    or the seed a reshard to another world size gave it, as bytes."""
    manifest = checkpoint.read_manifest(folder)
    shards = [checkpoint.read_verified(folder, entry) for entry in manifest["files"]
              if entry["rank"] is not None]
    return [(shard["rng_state"] if "rng_state" in shard else shard["rng_seed"]).numpy().tobytes()
            for shard in shards]


def test_reshard_4_to_2_ranks_and_train_on(saved, tmp_path):
    root, straight = saved
    folder = reshard(step_folder(root, 10), tmp_path, 2)
    manifest = json.loads((folder / "manifest.json").read_text())
    layouts = [f["layout"] for f in manifest["files"] if f["rank"] is not None]
    assert [(l["start"], l["length"], l["padding"]) for l in layouts] == [(0, 3461, 0), (3461, 3461, 0)]
    resumed = launch.spawn(checkpoint_lab.resume_training, RUN, str(folder), world_size=2)
    assert all(torch.equal(r["params"], resumed[0]["params"]) for r in resumed)
    # Another world size sums gradients in another order: float32 tolerance, as in lesson 78.
    assert (resumed[0]["params"] - straight[0]["params"]).abs().max() < 1e-5
    # Each new rank's generator was seeded from the seed its own shard holds: two streams.
    seeds = [checkpoint.read_verified(folder, f)["rng_seed"].item() for f in manifest["files"]
             if f["rank"] is not None]
    assert [r["rng_state"].tolist() for r in resumed] == [
        torch.Generator().manual_seed(seed).get_state().tolist() for seed in seeds]
    assert not torch.equal(resumed[0]["rng_state"], resumed[1]["rng_state"])
    back = reshard(folder, tmp_path / "back", 3)  # 2 -> 3 needs padding again, on the last shard
    assert [f["layout"]["padding"] for f in json.loads((back / "manifest.json").read_text())["files"]
            if f["rank"] is not None] == [0, 0, 2]


def test_resharding_gives_every_new_rank_a_random_stream_of_its_own(saved, tmp_path):
    root, _ = saved
    source = step_folder(root, 10)
    eight = reshard(source, tmp_path / "eight", 8)
    streams = random_streams(eight)
    assert len(streams) == 8 and len(set(streams)) == 8  # r mod 4 would give ranks r, r + 4 one
    assert random_streams(reshard(source, tmp_path / "again", 8)) == streams  # reproducible
    assert len(set(random_streams(reshard(source, tmp_path / "two", 2)))) == 2
    # The same world size keeps every rank's own saved state.
    assert random_streams(reshard(source, tmp_path / "four", 4)) == random_streams(source)


def test_consolidated_state_loads_into_torch_adam_and_trains_on(saved):
    root, straight = saved
    model_state, adam_state = consolidate(step_folder(root, 10))
    model = build_model("mlp", 99)
    model.load_state_dict(model_state)
    adam = torch.optim.Adam(model.parameters(), lr=RUN.lr)
    adam.load_state_dict(adam_state)
    for step in range(10, 20):
        adam.zero_grad()
        run_loss(RUN, model, step).backward()
        adam.step()
    final = flat_parameters(model)
    assert (final - straight[0]["params"]).abs().max() < 1e-5
    reference = in_one_rank(train_single_process, RUN)["params"]
    assert (final - reference).abs().max() < 1e-5


def clock_decisions(rank, world_size):
    """A clock policy of 60 s on every rank, rank 0's clock 1 s ahead of the others'."""
    policy = CheckpointPolicy(every_seconds=60.0, last_save_time=0.0)
    return [policy.should_save(step, now=now + (1.0 if rank == 0 else 0.0))
            for step, now in [(1, 30.0), (2, 59.5), (3, 61.0), (4, 119.0), (5, 121.0)]]


def test_a_clock_policy_makes_every_rank_save_at_the_same_step():
    decisions = launch.spawn(clock_decisions, world_size=3, timeout_s=60)
    # Rank 0 finds the save due at step 2 (60.5 s), the others only at step 3: they save at 2.
    assert decisions == [[False, True, False, False, True]] * 3


def test_a_signal_on_one_rank_makes_every_rank_save_at_the_same_step():
    """SIGUSR1 reaches rank 2 alone, during step 3: every rank saves after step 3, and stops."""
    decisions = launch.spawn(checkpoint_lab.save_on_signal, 2, 3, world_size=3, timeout_s=60)
    assert [d["saves after step"] for d in decisions] == [3, 3, 3]
    assert [d["handler ran"] for d in decisions] == [False, False, True]


def test_a_signal_just_after_the_flags_all_reduce_makes_every_rank_save_at_the_next_step():
    """The same signal sent just after step 3's should_save: rank 2's handler ran, its flag
    missed step 3's all-reduce, so every rank saves after step 4."""
    decisions = launch.spawn(checkpoint_lab.save_on_signal, 2, 3, 5, True, world_size=3, timeout_s=60)
    assert [d["saves after step"] for d in decisions] == [4, 4, 4]
    assert [d["handler ran"] for d in decisions] == [False, False, True]


def late_request_decisions(rank, world_size):
    """A save asked for on rank 2 just after step 2's all-reduce of the flags (a signal that
    arrives then): each rank's (due, requested) after steps 1 to 3."""
    policy = CheckpointPolicy(every_steps=100, on_request=True)
    real_all_reduce = dist.all_reduce

    def all_reduce_then_signal(*args, **kwargs):
        work = real_all_reduce(*args, **kwargs)
        policy.request_save()  # what the signal handler does
        return work

    decisions = []
    for step in range(1, 4):
        dist.all_reduce = all_reduce_then_signal if (rank, step) == (2, 2) else real_all_reduce
        try:
            decisions.append((policy.should_save(step), policy.requested))
        finally:
            dist.all_reduce = real_all_reduce
    return decisions


def test_a_request_after_the_all_reduce_counts_at_the_next_step_on_every_rank():
    """Acting on it at once, on rank 2 alone, would make rank 2 save (and stop) while the others
    go on: the next collective would then wait until the group's timeout."""
    decisions = launch.spawn(late_request_decisions, world_size=3, timeout_s=60)
    assert decisions == [[(False, False), (False, False), (True, True)]] * 3


def test_keep_last_k_and_the_clock_policy(saved, tmp_path):
    root, _ = saved
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    assert [step for step, _ in list_checkpoints(copy)] == [10, 15]
    assert prune_checkpoints(copy, keep_last=1) == [step_folder(copy, 10)]
    assert [step for step, _ in list_checkpoints(copy)] == [15]
    with pytest.raises(ValueError, match="keep_last must be a positive int, got 0: pass 1 or more"):
        prune_checkpoints(copy, 0)
    policy = CheckpointPolicy(every_steps=10, every_seconds=60.0, last_save_time=0.0)
    assert policy.should_save(10, now=1.0)            # the step rule
    assert not policy.should_save(11, now=30.0)
    assert policy.should_save(12, now=61.5)           # the clock rule, 60 s after the last save
    assert not policy.should_save(13, now=62.0)
    with pytest.raises(ValueError, match="never save"):
        CheckpointPolicy()


def test_an_fsdp2_model_and_adam_saved_with_dcp_on_4_ranks_load_on_2_bit_for_bit(tmp_path):
    """torchtitan's path: get_state_dict, dcp.save on 4 ranks; a fresh FSDP2 model and Adam on 2
    ranks take their own get_state_dict as the template, dcp.load and set_state_dict."""
    run, folder = ZeroRun(steps=3), str(tmp_path / "fsdp2")
    saved = launch.spawn(checkpoint_lab.fsdp2_save, run, folder, world_size=4)
    loaded = launch.spawn(checkpoint_lab.fsdp2_load, run, folder, world_size=2)
    for key in ("params", "exp_avg", "exp_avg_sq"):
        assert all(torch.equal(saved[0][key], row[key]) for row in loaded), key
    assert loaded[0]["step"] == saved[0]["step"] == 3
    assert sum(row["local_numel"] for row in saved) == sum(row["local_numel"] for row in loaded)
    assert saved[0]["exp_avg"].abs().max() > 0  # trained: the moments are not a fresh Adam's


def test_dcp_reshards_our_flat_vectors_at_load_and_async_save_keeps_the_state_of_the_call(saved, tmp_path):
    """Our step-10 shards saved with dcp.async_save as Shard(0) DTensors on 4 ranks, each rank
    overwriting its tensors with NaN right after the call, then loaded as DTensors on 2 ranks:
    the very elements our offline reshard writes, and .metadata's chunks are the 4 slices."""
    root, _ = saved
    folder, destination = step_folder(root, 10), str(tmp_path / "dcp")
    launch.spawn(checkpoint_lab.dcp_save_as_dtensors, str(folder), destination, world_size=4)
    numel = checkpoint.read_manifest(folder)["files"][0]["layout"]["numel"]
    on_two = launch.spawn(checkpoint_lab.dcp_load_as_dtensors, destination, numel, world_size=2)
    ours = reshard(folder, tmp_path / "ours", 2)
    for rank, loaded in enumerate(on_two):  # no NaN reached the disk, and no element moved
        expected = load_sharded(ours, rank=rank, world_size=2, replicated=False)[0]
        assert all(torch.equal(loaded[key], expected[key]) for key in loaded)
    chunks = checkpoint_lab.dcp_chunks(destination, "master")
    assert [(c["start"], c["elements"]) for c in chunks] == [
        (0, 1731), (1731, 1731), (3462, 1731), (5193, 1729)]  # real elements, padding stripped


def test_dcp_places_the_shared_model_tensors_on_the_least_loaded_holder_or_on_the_lowest(tmp_path):
    """DCP's default dedup keeps every model tensor (which all 4 ranks hold) off rank 0, whose own
    vectors are counted first; lowest_rank=True (dedup_save_to_lowest_rank) puts them all on rank
    0, whose file then carries exactly the bytes the other ranks' files carried beyond their own."""
    files, sizes = {}, {}
    for lowest in (False, True):
        saved = launch.spawn(checkpoint_lab.save_ours_and_dcp, ZeroRun(model="gpt"),
                             str(tmp_path / str(lowest)), lowest, world_size=4)[0]
        files[lowest] = [row["model tensors"] for row in checkpoint_lab.dcp_files(saved["dcp"])]
        sizes[lowest] = [(tmp_path / str(lowest) / "dcp" / f"__{r}_0.distcp").stat().st_size
                         for r in range(4)]
    assert files[False][0] == 0 and min(files[False][1:]) > 0
    assert files[True] == [sum(files[False]), 0, 0, 0]
    assert sizes[True][1:] == [sizes[False][0]] * 3 and sum(sizes[True]) == sum(sizes[False])


def test_dcp_reshards_our_flat_vectors_at_load_time_as_reshard_does(tmp_path):
    """Step 15's flat vectors saved again by 4 ranks as DTensors (Shard(0)) and loaded by 2: each
    rank reads only the files whose chunks overlap its half, and gets reshard's shard exactly."""
    root = tmp_path / "run"
    launch.spawn(checkpoint_lab.train_with_checkpoints, RUN, str(root), [15], world_size=4,
                 timeout_s=120)
    reshard(step_folder(root, 15), tmp_path / "two", 2)
    launch.spawn(checkpoint_lab.save_flat_as_dtensors, str(step_folder(root, 15)), str(tmp_path / "dcp"),
                 world_size=4, timeout_s=60)
    loaded = launch.spawn(checkpoint_lab.load_dtensors_resharded, str(tmp_path / "dcp"),
                          str(step_folder(tmp_path / "two", 15)), world_size=2, timeout_s=60)
    assert [r["files read"] for r in loaded] == ["__0_0.distcp, __1_0.distcp",
                                                 "__1_0.distcp, __2_0.distcp, __3_0.distcp"]
    assert all(r["equal to reshard's, bit for bit"] for r in loaded)
    persian = launch.spawn(checkpoint_lab.load_dtensors_resharded, str(tmp_path / "dcp"),
                           str(step_folder(tmp_path / "two", 15)), "fa", world_size=2, timeout_s=60)
    assert persian[0]["files read"] == "__0_0.distcp، __1_0.distcp"  # a Persian table's list
