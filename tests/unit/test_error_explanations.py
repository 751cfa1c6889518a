"""The course's errors say what happened in Persian too (error.explain("fa")), from the facts
they keep, while their English messages stay as they were: the launcher's errors (rank, world
size, signal, exit code, ranks still running) and the checkpoint's (the file and its fault)."""

import json
import re

import pytest
import torch

from lesson_code.checkpoint import files
from lesson_code.checkpoint.files import (CheckpointError, ManifestDamagedError,
                                          ManifestMissingError, ShardCorruptedError,
                                          ShardMissingError, check_entry, read_manifest,
                                          write_file, write_manifest)
from lesson_code.checkpoint.tools import Skipped, latest_checkpoint
from lesson_code.runtime.errors import RankCrashedError, RankFailedError, RankTimeoutError

PERSIAN_LETTER = re.compile(r"[\u0600-\u06ff]")


def english_words(text: str) -> list[str]:
    """Lowercase Latin words of a Persian sentence outside `code` and left-to-right isolates."""
    text = re.sub("`[^`]*`|\u2066[^\u2069]*\u2069", " ", text)
    return [w for w in re.findall(r"[A-Za-z][A-Za-z0-9_]*", text)
            if w.islower() and len(w) > 1 and w not in {"gloo", "sha256"}]


def assert_persian(sentence: str, *facts: str) -> None:
    assert PERSIAN_LETTER.search(sentence) and not english_words(sentence), sentence
    for fact in facts:
        assert fact in sentence, (fact, sentence)


def test_a_rank_killed_by_a_signal_is_told_in_both_languages():
    error = RankCrashedError(1, 4, -9, output="")
    english = ("rank 1 of 4 was killed by SIGKILL before returning a result; the other ranks were "
               "stopped. Check the rank's memory use and anything that may kill it.")
    assert str(error) == english and error.explain("en") == english
    assert_persian(error.explain("fa"), "رتبهٔ ۱ از ۴ رتبه", "SIGKILL",
                   "مصرف حافظهٔ این رتبه و هر چیزی را که ممکن است آن را بکشد وارسی کنید.")


@pytest.mark.parametrize("error, facts", [
    (RankCrashedError(0, 2, -6), ["رتبهٔ ۰ از ۲", "SIGABRT", "gloo"]),
    (RankCrashedError(3, 4, 7, started=True), ["رتبهٔ ۳ از ۴", "کد خروج ۷", "\u2066os._exit\u2069"]),
    (RankCrashedError(3, 4, 7), ["کد خروج ۷", "if __name__"]),
    (RankFailedError(2, 4, "Traceback ...\nValueError: no"), ["رتبهٔ ۲ از ۴", "ValueError"]),
    (RankTimeoutError([0, 1], 4, 30.0), ["رتبه‌های [۰، ۱] از ۴", "۳۰ ثانیه"]),
    (RankTimeoutError([0, 1], 2, 5.0, where={r: ["send (torch/distributed/c10d.py:1)"]
                                             for r in (0, 1)}), ["\u2066dist.send\u2069"]),
])
def test_every_spawn_error_explains_itself_in_persian(error, facts):
    assert error.explain("en") == str(error).split("\n")[0]
    assert_persian(error.explain("fa"), *facts)
    assert "`" not in error.explain("fa")  # code names isolated, not in backticks
    with pytest.raises(ValueError, match="unknown language"):
        error.explain("de")


def checkpoint(folder):
    """A one-file checkpoint written with the files layer: (folder, its file's entry)."""
    folder.mkdir(parents=True)
    entry = write_file(folder, "shard-00000-of-00001.pt", {"w": torch.arange(10.0)})
    write_manifest(folder, {"format_version": files.FORMAT_VERSION, "step": 1, "world_size": 1,
                            "files": [entry]})
    return folder, entry


def raised(call) -> CheckpointError:
    with pytest.raises(CheckpointError) as caught:
        call()
    return caught.value


def test_each_damage_names_the_file_and_the_fault_in_both_languages(tmp_path):
    folder, entry = checkpoint(tmp_path / "step-00000001")
    shard = folder / entry["name"]
    shard.write_bytes(shard.read_bytes()[:100])  # cut short
    cut = raised(lambda: check_entry(folder, entry))
    assert type(cut) is ShardCorruptedError and cut.fault == "shard_size"
    assert cut.path == str(shard) and cut.facts == {"size": 100, "expected": entry["bytes"]}
    assert str(cut).startswith(f"{shard} is 100 bytes but the manifest says")
    assert_persian(cut.explain("fa"), f"\u2066{shard}\u2069", "۱۰۰ بایت")

    payload = bytearray(shard.read_bytes()[:100].ljust(entry["bytes"], b"\0"))
    changed = raised(lambda: check_entry(folder, entry, bytes(payload)))
    assert changed.fault == "shard_changed" and changed.facts["recorded"] == entry["sha256"][:16] + "..."
    assert_persian(changed.explain("fa"), entry["sha256"][:16], "چکیدهٔ \u2066sha256\u2069 فایل")

    shard.unlink()
    missing = raised(lambda: check_entry(folder, entry))
    assert type(missing) is ShardMissingError and missing.explain("en") == str(missing)
    assert_persian(missing.explain("fa"), str(shard))

    manifest = folder / files.MANIFEST
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "step": 2}))
    edited = raised(lambda: read_manifest(folder))
    assert type(edited) is ManifestDamagedError and edited.fault == "manifest_changed"
    assert_persian(edited.explain("fa"), "manifest.sha256", "چکیدهٔ \u2066sha256\u2069 آن")

    manifest.unlink()
    gone = raised(lambda: read_manifest(folder))
    assert type(gone) is ManifestMissingError and gone.facts == {"folder": "step-00000001"}
    assert_persian(gone.explain("fa"), "\u2066latest_checkpoint()\u2069")
    assert "`" not in gone.explain("fa")


def test_what_latest_checkpoint_skipped_explains_itself(tmp_path):
    checkpoint(tmp_path / "step-00000001")
    (tmp_path / ".step-00000003.tmp").mkdir()  # a save that never wrote its manifest
    (tmp_path / "step-00000002").mkdir()  # published, but its manifest is gone
    folder, skipped = latest_checkpoint(tmp_path)
    assert folder.name == "step-00000001"
    assert skipped == [".step-00000003.tmp: an interrupted save, never published",
                       f"step-00000002: {tmp_path}/step-00000002/manifest.json does not exist: "
                       "step-00000002 is not a complete checkpoint (a save that was interrupted "
                       "never writes it); load an earlier step, see latest_checkpoint()"]
    assert all(isinstance(reason, Skipped) for reason in skipped)
    assert skipped[0].explain("en") == skipped[0]
    assert_persian(skipped[0].explain("fa"), "\u2066.step-00000003.tmp\u2069", "نیمه‌کاره")
    assert_persian(skipped[1].explain("fa"), "\u2066step-00000002\u2069")
    import pickle
    again = pickle.loads(pickle.dumps(skipped[1]))  # a rank's result crosses processes by value
    assert again == skipped[1] and again.explain("fa") == skipped[1].explain("fa")


def test_an_error_without_a_known_fault_explains_itself_with_its_message():
    assert CheckpointError("plain").explain("fa") == "plain"


def test_a_refused_restart_says_in_persian_what_failed_to_load_and_what_was_skipped(tmp_path):
    """resume's refusal (rank 0's choice, tools.choose_checkpoint) keeps the English message's two lists:
    the folders whose load failed and the ones skipped, «هیچ» where a list is empty."""
    from lesson_code.checkpoint.tools import choose_checkpoint
    (tmp_path / "step-00000002").mkdir()  # published, but its manifest is gone: skipped
    failed = [tmp_path / "step-00000003", tmp_path / "step-00000001"]
    refusal = raised(lambda: choose_checkpoint(tmp_path, failed, lock_timeout_s=5.0))
    assert "(load failed: step-00000003, step-00000001; skipped: step-00000002: " in str(refusal)
    told = refusal.explain("fa")
    assert_persian(told, "(بارگذاری ناکام: \u2066step-00000003\u2069، \u2066step-00000001\u2069؛ "
                         "کنارگذاشته: \u2066step-00000002\u2069: ", "روی آن‌ها می‌نوشت")
    (tmp_path / "step-00000002").rmdir()
    assert_persian(raised(lambda: choose_checkpoint(tmp_path, failed, lock_timeout_s=5.0)).explain("fa"),
                   "کنارگذاشته: هیچ‌کدام)")


def test_the_ranks_that_found_a_fault_close_its_persian_sentence():
    """Lesson 80 prints a refusal rank 0 found, lesson 80a one that two ranks found."""
    def told(found_by):
        return CheckpointError("x [found by ...]", path="/run/step-00000001/manifest.json",
                               fault="manifest_missing", folder="/run/step-00000001",
                               found_by=found_by).explain("fa")
    assert told([0]).endswith(" (یافتهٔ رتبهٔ ۰)")
    assert told([0, 1]).endswith(" (رتبه‌های ۰ و ۱ آن را یافتند)")
    assert told([0, 2, 3]).endswith(" (رتبه‌های ۰، ۲ و ۳ آن را یافتند)")


def test_a_world_size_mismatch_gives_the_same_reshard_call_in_both_languages(tmp_path):
    from lesson_code.checkpoint import shards
    folder, _ = checkpoint(tmp_path / "step-00000001")  # saved by 1 rank
    mismatch = raised(lambda: shards.load_sharded(folder, rank=0, world_size=2))  # on 2 ranks
    call = f"reshard({str(folder)!r}, dst, 2)"
    assert mismatch.fault == "world_size" and str(mismatch).endswith(f"e.g. {call}")
    told = mismatch.explain("fa")
    assert_persian(told, f"\u2066{call}\u2069")  # the call to copy, left to right, digits Latin
    assert "`" not in told
