"""Lesson 80's grader: the course's checkpoint passes, the template fails, each mistake fails its
check (a shard not verified, a manifest that forgets a file, a save written straight into its
published folder...), and says which."""

from pathlib import Path

import pytest

from practice_helpers import SOLUTIONS, grade, variant
from lesson_code.practice.cli import main
from lesson_code.practice.lessons import lesson
from lesson_code.practice.templates import write_template

LEARNER = SOLUTIONS / "sharded_checkpoint_learner.py"
CHECK_KEYS = [check.key for check in lesson(80).checks]

MISTAKES = {
    "names": [("def load_sharded(", "def load_checkpoint(")],
    # Only rank 0 reads the replicated tensors back, "because rank 0 wrote them".
    "round_trip": [("if replicated and REPLICATED in entries else {}",
                    "if replicated and rank == 0 and REPLICATED in entries else {}")],
    # replicated.pt is written, but its entry never reaches the manifest.
    "manifest": [("            entries.append({**_write(staging / REPLICATED, replicated), "
                  "\"rank\": None, \"layout\": {}})\n",
                  "            _write(staging / REPLICATED, replicated)\n")],
    # The size is checked, the sha256 is not: a flipped byte keeps the size.
    "damaged_shard": [("    if hashlib.sha256(payload).hexdigest() != entry[\"sha256\"]:\n"
                       "        raise ValueError(f\"{folder / entry['name']} does not match its "
                       "sha256 in the manifest\")\n", "")],
    # Shard files named by rank alone, and the manifest's world size never compared.
    "world_size": [("return f\"shard-{rank:05d}-of-{world_size:05d}.pt\"",
                    "return f\"shard-{rank:05d}.pt\""),
                   ("    if manifest[\"world_size\"] != world_size:\n        raise ValueError(",
                    "    if False:\n        raise ValueError(")],
    # No staging folder: every file goes straight into the published one.
    "crash": [("    staging = final.with_name(f\".{final.name}.tmp\")\n",
               "    staging = final\n"),
              ("        _publish(staging, final)\n", "")],
}
EXPECTED_KIND = {"names": "missing", "round_trip": "value", "manifest": "unlisted",
                 "damaged_shard": "accepted_flipped", "world_size": "accepted_world_size",
                 "crash": "published_half"}


def test_every_check_has_a_mistake_that_it_catches() -> None:
    assert sorted(MISTAKES) == sorted(CHECK_KEYS) == sorted(EXPECTED_KIND)


def test_the_course_implementation_passes_every_check(tmp_path: Path, capsys) -> None:
    path = tmp_path / "course_filled.py"
    path.write_text("from lesson_code.checkpoint import load_sharded, save_sharded\n")
    assert main(["check", "80", str(path)]) == 0
    report = capsys.readouterr().out
    assert f"All {len(CHECK_KEYS)} checks passed." in report and "FAILED" not in report
    assert "the course's" in report  # the timing line, printed once every check passed


def test_a_learner_style_checkpoint_passes_every_check() -> None:
    results = grade(80, LEARNER)
    assert {key: result.failure for key, result in results.items() if not result.passed} == {}


def test_the_unfilled_template_fails_every_check_but_names_with_not_implemented(
        tmp_path: Path) -> None:
    path = write_template(80, "en", tmp_path / "mine.py")
    results = grade(80, path)
    assert results["names"].passed
    for key in CHECK_KEYS[1:]:
        failure = results[key].failure
        assert failure.kind == "raised" and "NotImplementedError" in failure.fields["error"], key
        assert "mine.py" in failure.details


@pytest.mark.parametrize("key", CHECK_KEYS)
def test_a_mistake_fails_its_check(key: str, tmp_path: Path) -> None:
    path = variant(LEARNER, MISTAKES[key], tmp_path)
    failure = grade(80, path, keys=(key,))[key].failure
    assert failure is not None, f"the check {key!r} passed a file with its mistake"
    assert failure.kind == EXPECTED_KIND[key], failure


def test_a_save_that_first_deletes_the_old_copy_of_its_step_loses_it(tmp_path: Path) -> None:
    """Crash case 2: saving step 4 again, the old step-4 goes before the new one is complete."""
    path = variant(LEARNER, [("        shutil.rmtree(staging, ignore_errors=True)\n",
                              "        shutil.rmtree(staging, ignore_errors=True)\n"
                              "        shutil.rmtree(final, ignore_errors=True)\n")], tmp_path)
    failure = grade(80, path, keys=("crash",))["crash"].failure
    assert failure.kind == "lost_previous" and failure.fields["folder"] == "step-00000004", failure

