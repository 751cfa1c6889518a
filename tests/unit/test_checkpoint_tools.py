"""Lesson 80's one-process tools: Young's interval, a shard's own padding, the changes between two
states of a folder, what latest_checkpoint says of a save in progress, a folder whose name and
manifest disagree on the step, and the memory that reshard and consolidate need."""

import contextlib
import os
import pickle
import shutil
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

import pytest
import torch

from lesson_code.checkpoint import (CheckpointError, ManifestDamagedError, ManifestMissingError, ShardCorruptedError,
                                     ShardMissingError, step_folder)
from lesson_code.checkpoint.faults import flip_one_byte
from lesson_code.checkpoint.files import verify_checkpoint, write_file
from lesson_code.checkpoint.flat_state import FLAT_KEYS
from lesson_code.checkpoint.lock import locked
from lesson_code.checkpoint.shards import flat_layout, shard_name
from lesson_code.checkpoint.staging import seal, stage, staging_folder
from lesson_code.checkpoint import tools
from lesson_code.checkpoint.tools import (Skipped, latest_checkpoint, list_checkpoints,
                                          prune_checkpoints, recover_checkpoints, time_lost,
                                          young_interval)
from lesson_code.checkpoint_lab import folder_changes, save_in_steps, sha256_rate


def test_young_interval_balances_the_saves_against_the_work_a_failure_loses():
    interval = young_interval(save_s=30.0, mtbf_s=3 * 3600.0)
    assert interval == pytest.approx(804.98, abs=0.01)  # sqrt(2 * 30 * 10800)
    best = time_lost(interval, 30.0, 3 * 3600.0)
    assert best == pytest.approx(2 * 30.0 / interval)  # at the optimum both terms are equal
    assert time_lost(interval / 2, 30.0, 3 * 3600.0) > best < time_lost(interval * 2, 30.0, 3 * 3600.0)
    for bad in (0, -1.0, True, "30"):
        with pytest.raises(ValueError, match="save_s must be a number of seconds above 0"):
            young_interval(bad, 3600.0)


def test_the_hashing_rate_is_one_line_per_edition_with_a_positive_rate():
    english, persian = sha256_rate("en", mib=1, rounds=2), sha256_rate("fa", mib=1, rounds=2)
    rate = float(english.split(": ")[1].split(" GB/s")[0])
    assert rate > 0 and "the best of 2 passes over 1 MiB" in english
    assert "گیگابایت بر ثانیه" in persian and "۱ مبی‌بایت" in persian  # Persian units, as in the prose
    assert "GB/s" not in persian and "MiB" not in persian and "best" not in persian
    assert "گذر" not in persian  # the book's word for a forward or backward pass, not a round


def test_the_save_in_steps_line_shows_times_that_give_its_ratio():
    # Each pair once printed a ratio that its own rounded times did not give (82 / 44.5 = 1.8,
    # printed 1.9; 114 / 32 = 3.6, printed 3.5): the ratio must be that of the shown times.
    for save_s, step_s in ((0.08244, 0.044455), (0.1144, 0.0324), (0.151, 0.0502)):
        english = save_in_steps({"save_s": save_s, "step_s": step_s}, "en")
        steps = float(english.split(" as long as ")[1].split(" training steps")[0])
        save_ms = float(english.split(": save ")[1].split(" ms")[0])
        step_ms = float(english.split(", step ")[1].split(" ms")[0])
        assert f"{save_ms / step_ms:.1f}" == f"{steps:.1f}", english
    persian = save_in_steps({"save_s": 0.1144, "step_s": 0.0324}, "fa")
    assert "۱۱۴٫۴" in persian and "۳۲٫۴" in persian and "۳٫۵" in persian, persian


def first_strong_direction(line: str) -> str:
    """The Unicode bidi class (L, R or AL) of `line`'s first strong letter outside left-to-right
    isolates: the direction a reader's `unicode-bidi: plaintext` lays the printed line out in."""
    depth = 0
    for char in line:
        depth += char == "\u2066"
        depth -= char == "\u2069" and depth > 0
        if not depth and unicodedata.bidirectional(char) in ("L", "R", "AL"):
            return unicodedata.bidirectional(char)
    return ""


def test_the_persian_hashing_rate_line_reads_right_to_left_with_sha256_isolated():
    persian = sha256_rate("fa", mib=1, rounds=1)
    assert first_strong_direction(persian) == "AL", persian  # a Latin first word made it left to right
    assert "\u2066sha256\u2069" in persian and persian.count("sha256") == 1


def test_only_the_shards_past_the_real_elements_count_padding():
    # 6922 elements on 4 ranks: 1731 each, the last 2 past the end; on 3 ranks, 2308 each.
    assert [flat_layout(6922, start, 1731)["padding"] for start in (0, 1731, 3462, 5193)] == [
        0, 0, 0, 2]
    assert flat_layout(6922, 4616, 2308) == {"numel": 6922, "start": 4616, "length": 2308,
                                             "padding": 2}
    assert flat_layout(5, 6, 3)["padding"] == 3  # a shard wholly past the end: all padding


def test_folder_changes_name_a_renamed_folder_once():
    states = [["step-1/", "step-1/a"], ["step-1/", "step-1/a", ".tmp/"],
              ["step-1/", "step-1/a", ".tmp/", ".tmp/b"],
              ["step-1/", "step-1/a", "step-2/", "step-2/b"]]
    assert folder_changes(states) == ["—", "+ .tmp", "+ .tmp/b", "+ step-2; − .tmp"]


def test_a_prune_stopped_half_way_leaves_no_published_folder_incomplete(tmp_path, monkeypatch):
    """A crash while a prune deletes a checkpoint's files (one file gone, then the process dies)
    must not leave a step-N with files missing: a tool that trusts published names would meet
    it. The next prune deletes what the stopped one left."""
    root = tmp_path / "run"
    for step in (1, 2, 3):
        one_process_checkpoint(root, step)
    real_rmtree = shutil.rmtree

    def crash_after_one_file(path, *args, **kwargs):
        next(entry for entry in sorted(Path(path).iterdir()) if entry.is_file()).unlink()
        raise OSError("the process died while deleting")

    monkeypatch.setattr(shutil, "rmtree", crash_after_one_file)
    with pytest.raises(OSError, match="died while deleting"):
        prune_checkpoints(root, keep_last=1)
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    for _, folder in list_checkpoints(root):
        verify_checkpoint(folder)  # every published name is a complete checkpoint
    assert latest_checkpoint(root) == (step_folder(root, 3), [])
    assert recover_checkpoints(root) == []  # a half-deleted copy is never published again
    left = sorted(path.name for path in prune_checkpoints(root, keep_last=1))
    assert left == [".step-00000001.deleting", ".step-00000002.deleting"]
    assert sorted(path.name for path in root.iterdir() if path.is_dir()) == ["step-00000003"]


def test_a_save_in_progress_is_not_called_interrupted_and_travels_between_processes():
    error = ManifestMissingError("no manifest", path="root/.step-00000004.tmp/manifest.json",
                                 fault="manifest_missing", folder=".step-00000004.tmp")
    running = Skipped(".step-00000004.tmp", error, interrupted=True, running=True)
    assert running == (".step-00000004.tmp: a save in progress (a writer holds the folder's "
                       "lock), not published yet")
    assert "interrupted" not in running and "نیمه‌کاره" not in running.explain("fa")
    again = pickle.loads(pickle.dumps(running))
    assert (again, again.running, again.explain("fa")) == (running, True, running.explain("fa"))
    assert Skipped(".step-00000004.tmp", error, interrupted=True) == (
        ".step-00000004.tmp: an interrupted save, never published")


def one_process_checkpoint(root, step, numel=10, world_size=2):
    """A flat-state checkpoint of `step` written in one process, as save_flat_state writes one:
    the three flat vectors cut in `world_size` shards, each rank's RNG state, the model's weight
    and the parameter table. Returns its folder and the three whole vectors."""
    vectors = {key: torch.arange(numel, dtype=torch.float32) + index * numel
               for index, key in enumerate(FLAT_KEYS)}
    final = step_folder(root, step)
    length = -(-numel // world_size)
    files = []
    with locked(root, "a test's save"):
        staging = stage(final)
        for rank in range(world_size):
            start = rank * length
            shard = {key: torch.cat([value, value.new_zeros(length * world_size - numel)])
                     [start: start + length].clone() for key, value in vectors.items()}
            shard["rng_state"] = torch.get_rng_state()
            files.append({**write_file(staging, shard_name(rank, world_size), shard), "rank": rank,
                          "layout": {**flat_layout(numel, start, length), "flat": FLAT_KEYS}})
        extra = {"optimizer_step": 3, "parameters": [["weight", [numel], "float32"]],
                 "hyperparameters": {"lr": 0.1, "betas": [0.9, 0.999], "eps": 1e-8,
                                     "weight_decay": 0.0}}
        seal(staging, final, files, step=step, world_size=world_size, extra=extra,
             replicated={"weight": vectors["master"].clone()})
    return final, vectors


def test_a_folder_whose_name_and_manifest_disagree_on_the_step_is_refused_naming_both(tmp_path):
    """A copy of step 15 named step-00000020 would resume at step 16 as if it were step 20."""
    root = tmp_path / "run"
    fifteen, _ = one_process_checkpoint(root, 15)
    shutil.copytree(fifteen, step_folder(root, 20))
    with pytest.raises(ManifestDamagedError) as caught:
        verify_checkpoint(step_folder(root, 20))
    error = caught.value
    assert error.fault == "step_mismatch" and (error.facts["step"], error.facts["named"]) == (15, 20)
    assert "records step 15, but its folder's name, step-00000020, says step 20" in str(error)
    assert "step-00000015" in str(error) and "step-00000015" in error.explain("fa")
    folder, skipped = latest_checkpoint(root)
    assert folder == fifteen and [line.folder for line in skipped] == ["step-00000020"]
    assert prune_checkpoints(root, keep_last=1) == []  # the misnamed copy does not count as kept
    shutil.copytree(fifteen, tmp_path / "a copy for inspection")  # not a save's name: no claim
    assert verify_checkpoint(tmp_path / "a copy for inspection")["step"] == 15


PEAK_SCRIPT = """
import sys
from pathlib import Path
from lesson_code.checkpoint.flat_state import consolidate
from lesson_code.checkpoint.tools import reshard

def status_kib(field):
    line = next(line for line in open("/proc/self/status") if line.startswith(field + ":"))
    return int(line.split()[1])

Path("/proc/self/clear_refs").write_text("5")  # the peak so far (imports) is forgotten
before = status_kib("VmRSS")
if sys.argv[1] == "reshard":
    reshard(sys.argv[2], sys.argv[3], 8)
else:
    model_state, adam_state = consolidate(sys.argv[2])
print(1024 * (status_kib("VmHWM") - before))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(),
                    reason="reads the peak resident memory from Linux's /proc")
def test_reshard_and_consolidate_hold_about_one_copy_of_the_optimizer_state(tmp_path):
    """Their peak memory beyond the interpreter's stays under 1.6 times the state's bytes (one
    copy, plus the file being read and one new shard); concatenating the shards while they are
    still held takes about 2.9 (reshard) and 3.1 times (consolidate). Each runs in a fresh
    process, whose peak resident memory Linux records (reset after the imports); glibc is told
    to give every large block back when freed, so the peak is the tensors', not the allocator's
    caching."""
    numel = 6_000_000  # three vectors of 24 MB: 72 MB of state
    folder, _ = one_process_checkpoint(tmp_path / "run", 10, numel=numel, world_size=4)
    state_bytes = 3 * 4 * numel
    environment = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "1048576", "OMP_NUM_THREADS": "1"}
    for tool, arguments in (("reshard", [str(folder), str(tmp_path / "eight")]),
                            ("consolidate", [str(folder)])):
        done = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, tool, *arguments],
                              capture_output=True, text=True, env=environment, timeout=120,
                              check=True)
        peak = int(done.stdout.split()[-1])
        assert peak < 1.6 * state_bytes, (tool, peak / state_bytes)


def test_without_hashes_a_checkpoint_is_checked_on_its_manifest_and_sizes_only(tmp_path):
    """hashes=False reads no shard: a missing or truncated file is still refused, a changed byte
    is not (the load's own hashing finds it), and prune and latest_checkpoint count it as good; a
    restart that excludes it, once its load failed, gets the next older checkpoint."""
    root = tmp_path / "run"
    one_process_checkpoint(root, 1)
    two, _ = one_process_checkpoint(root, 2)
    flip_one_byte(two / shard_name(1, 2))
    assert verify_checkpoint(two, hashes=False)["step"] == 2
    with pytest.raises(ShardCorruptedError, match="sha256"):
        verify_checkpoint(two)
    assert latest_checkpoint(root, hashes=False) == (two, [])
    assert latest_checkpoint(root)[0] == step_folder(root, 1)
    # the restart whose load of step 2 failed excludes it and gets the next older checkpoint
    assert latest_checkpoint(root, hashes=False, exclude=[two]) == (step_folder(root, 1), [])
    assert latest_checkpoint(root, hashes=False, exclude=[two, step_folder(root, 1)]) == (None, [])
    with pytest.raises(TypeError, match="exclude must be a list of folders"):
        latest_checkpoint(root, exclude=two)
    assert prune_checkpoints(root, keep_last=1, hashes=False) == [step_folder(root, 1)]
    shard = two / shard_name(0, 2)
    shard.write_bytes(shard.read_bytes()[:-1])
    with pytest.raises(ShardCorruptedError, match="bytes but the manifest says"):
        verify_checkpoint(two, hashes=False)
    shard.unlink()
    with pytest.raises(ShardMissingError):
        verify_checkpoint(two, hashes=False)


def test_without_hashes_a_complete_hidden_copy_is_published_without_hashing_it(tmp_path):
    """A save stopped between manifest.sha256 and its rename leaves a complete .step-N.tmp. With
    hashes=False latest_checkpoint publishes it on its manifest and sizes, as it checks a
    published folder, and reads no file whole: a changed byte in it is left to the load. (Were it
    hashed here, one process would read the whole checkpoint while the other ranks wait.)"""
    root = tmp_path / "run"
    one_process_checkpoint(root, 1)
    two, _ = one_process_checkpoint(root, 2)
    hidden = staging_folder(two)
    two.rename(hidden)
    flip_one_byte(hidden / shard_name(1, 2))
    assert latest_checkpoint(root, hashes=False) == (two, [])
    assert two.is_dir() and not hidden.exists()
    two.rename(hidden)  # hashed, the changed byte is found and the copy stays hidden
    assert latest_checkpoint(root)[0] == step_folder(root, 1) and hidden.is_dir()


def test_latest_checkpoints_waits_for_the_lock_share_one_deadline(tmp_path, monkeypatch):
    """One call can wait twice: a second look at a published folder that fails to verify, then
    the publishing of a hidden copy. Each wait here is granted after 0.6 s: with 1 s for each
    wait the call would last 1.2 s, past a caller's bound (resume gives rank 0 half the other
    ranks' wait); with one deadline the second wait has 0.4 s left and raises in time."""
    one_process_checkpoint(tmp_path, 2)
    step_folder(tmp_path, 2).rename(staging_folder(step_folder(tmp_path, 2)))  # committed, hidden
    damaged, _ = one_process_checkpoint(tmp_path, 3)
    shard = damaged / shard_name(0, 2)
    shard.write_bytes(shard.read_bytes()[:-1])  # a wrong size: fails even without hashes
    waits = []

    @contextlib.contextmanager
    def granted_after_0_6_s(root, doing, *, shared=False, timeout_s):
        waits.append(timeout_s)
        time.sleep(min(timeout_s, 0.6))
        if timeout_s < 0.6:
            raise CheckpointError(f"{root} is still held", path=root, fault="locked",
                                  timeout_s=timeout_s)
        yield

    monkeypatch.setattr(tools, "locked", granted_after_0_6_s)
    began = time.monotonic()
    with pytest.raises(CheckpointError) as raised:
        latest_checkpoint(tmp_path, hashes=False, lock_timeout_s=1.0)
    assert raised.value.fault == "locked" and len(waits) == 2
    assert waits[1] < 0.45 and time.monotonic() - began < 1.3


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_the_save_timeline_names_rank_0s_files_only(lang):
    """Lesson 80's bullets name rank 0's files in order; its timeline figure names each of rank
    0's writes, and leaves the other ranks, which write only their shard, unnamed."""
    import matplotlib.pyplot as plt

    from lesson_code.plots import checkpoint as figures
    names = {"write": ["shard-00000-of-00002.pt", "shard-00001-of-00002.pt"]}
    saves = [{"rank": r, "events": [("write", ".owner", 0.0, 0.001)] * (r == 0)
              + [("write", names["write"][r], 0.002, 0.003), ("fsync", "", 0.0025, 0.003)]}
             for r in range(2)]
    texts = [t.get_text() for t in figures.save_timeline_figure(saves, lang=lang).axes[0].texts]
    files = figures.LABELS[lang]["files"]
    assert texts == [files[".owner"], files["shard"]]  # rank 0's two files; rank 1's shard unnamed
    plt.close("all")


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_the_save_timeline_names_the_roots_fsync_and_keeps_rank_0s_names_above_its_row(lang):
    """Lesson 80's bullets start from the root's fsync, before rank 0's first write: the figure
    names it. Every name of rank 0 sits above its row (y < 0 on an axis with rank 0 on top): a
    name below it would read as rank 1's."""
    import matplotlib.pyplot as plt

    from lesson_code.plots import checkpoint as figures
    saves = [{"rank": 0, "events": [("fsync", "", 0.0, 0.0005), ("write", ".owner", 0.001, 0.002),
                                    ("write", "shard-00000-of-00002.pt", 0.003, 0.004)]},
             {"rank": 1, "events": [("fsync", "", 0.0, 0.0005),
                                    ("write", "shard-00001-of-00002.pt", 0.003, 0.004)]}]
    texts = figures.save_timeline_figure(saves, lang=lang).axes[0].texts
    labels = figures.LABELS[lang]
    assert [t.get_text().lstrip("\u200f") for t in texts] == [  # a Persian label starts with RLM
        labels["root fsync"], labels["files"][".owner"], labels["files"]["shard"]]
    assert all(t.get_position()[1] < 0 for t in texts)
    plt.close("all")


def test_the_save_timeline_shows_the_roots_fsync_after_the_publish_line_with_its_name():
    """The page reads the root's fsync after the publish, which makes it durable, right of the
    red line: the time axis runs past it, 8% past the last event at least, and names it on rank
    0's row; no name runs past the axes' right or top edge."""
    import matplotlib.pyplot as plt

    from lesson_code.plots import checkpoint as figures
    events = [("fsync", "", 0.001, 0.002), ("write", ".owner", 0.0025, 0.003)]
    events += [("write", name, 0.07 + 0.001 * i, 0.07 + 0.001 * i + 0.0009)
               for i, name in enumerate(["replicated.pt", "manifest.json", "manifest.sha256"])]
    events += [("publish", "step-00000001", 0.073, 0.0731), ("fsync", "", 0.0732, 0.0734)]
    for lang in ("en", "fa"):
        figure = figures.save_timeline_figure([{"rank": 0, "events": events}], lang=lang)
        try:
            ax = figure.axes[0]
            assert ax.get_xlim()[1] >= 1.08 * 73.4
            renderer = figure.canvas.get_renderer()
            box = ax.get_window_extent(renderer)
            durable = [t for t in ax.texts if getattr(t, "xy", (0, 0))[0] > 73.1]  # right of the line
            assert [t.get_text().lstrip("\u200f") for t in durable] == [
                figures.LABELS[lang]["root fsync"]]
            assert durable[0].xy[1] == 0  # on rank 0's row
            for text in ax.texts:
                extent = text.get_window_extent(renderer)
                assert extent.x1 <= box.x1 and extent.y1 <= box.y1, text
        finally:
            plt.close(figure)


def test_lesson_80s_restart_table_names_a_run_that_crashed_in_the_middle_of_a_save():
    import pandas as pd

    from lesson_code.plots import checkpoint as figures
    shown = figures.table(pd.DataFrame({"loads": ["step-00000002"]}, index=["crashed mid-save"]), "fa")
    assert shown.index.tolist() == ["اجرایی که در میانهٔ ذخیره از کار افتاد"]


def test_one_request_makes_one_save_and_a_later_request_another():
    """Without a process group the policy decides alone; a request is answered by one save, and
    `requested` stays set so that a preempted job knows to stop."""
    from lesson_code.checkpoint.tools import CheckpointPolicy
    policy = CheckpointPolicy(every_steps=100, on_request=True)
    assert not policy.should_save(1)
    policy.request_save()
    assert policy.should_save(2) and policy.requested
    assert not policy.should_save(3) and policy.requested
    policy.request_save()
    assert policy.should_save(4)
    # Without on_request the request would not be shared: a rank would save alone.
    steps_only = CheckpointPolicy(every_steps=100)
    with pytest.raises(ValueError, match="on_request=True"):
        steps_only.request_save()
    assert not steps_only.asked_here and not steps_only.should_save(1)


def test_the_save_timeline_puts_a_name_just_above_its_bar_unless_a_neighbour_is_in_the_way():
    """Rank 0's shard, written far from `.owner`, is named at the nearest height, as `.owner` is
    when alone: a name placed higher with nothing below it reads as a title. Names of files
    written close together still take different heights."""
    import matplotlib.pyplot as plt

    from lesson_code.plots import checkpoint as figures
    far = [{"rank": 0, "events": [("write", ".owner", 0.010, 0.012),
                                  ("write", "shard-00000-of-00001.pt", 0.040, 0.044)]}]
    texts = figures.save_timeline_figure(far, lang="en").axes[0].texts
    assert len({t.get_position()[1] for t in texts}) == 1
    near = [("write", name, 0.070 + 0.001 * i, 0.0709 + 0.001 * i)
            for i, name in enumerate(["replicated.pt", "manifest.json", "manifest.sha256"])]
    texts = figures.save_timeline_figure([{"rank": 0, "events": near}], lang="en").axes[0].texts
    assert len({t.get_position()[1] for t in texts}) == 3
    plt.close("all")
