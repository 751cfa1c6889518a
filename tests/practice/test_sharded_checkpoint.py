"""Lesson 80's grader: the course's checkpoint passes, the template fails, each mistake fails its
check (a shard not verified, a manifest that forgets a file, a save written straight into its
published folder...), and says which."""

from pathlib import Path

import pytest

from practice_helpers import (
    SOLUTIONS, assert_course_passes, assert_mistake_fails, assert_passes, assert_template_fails,
    grade, variant,
)
from lesson_code.practice.lessons import lesson

LEARNER = SOLUTIONS / "sharded_checkpoint_learner.py"
CHECK_KEYS = [check.key for check in lesson(80).checks]

# The course's own implementation, as a learner's file.
COURSE_FILLED = 'from lesson_code.checkpoint import load_sharded, save_sharded\n'

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
    assert_course_passes(80, COURSE_FILLED, tmp_path, capsys)


def test_a_learner_style_checkpoint_passes_every_check() -> None:
    assert_passes(80, LEARNER)


def test_the_unfilled_template_fails_every_check_but_names_with_not_implemented(
        tmp_path: Path) -> None:
    assert_template_fails(80, tmp_path)


@pytest.mark.parametrize("key", CHECK_KEYS)
def test_a_mistake_fails_its_check(key: str, tmp_path: Path) -> None:
    assert_mistake_fails(80, LEARNER, MISTAKES[key], key, EXPECTED_KIND[key], tmp_path)


def test_a_save_that_first_deletes_the_old_copy_of_its_step_loses_it(tmp_path: Path) -> None:
    """Crash case 2: saving step 4 again, the old step-4 goes before the new one is complete."""
    path = variant(LEARNER, [("        shutil.rmtree(staging, ignore_errors=True)\n",
                              "        shutil.rmtree(staging, ignore_errors=True)\n"
                              "        shutil.rmtree(final, ignore_errors=True)\n")], tmp_path)
    failure = grade(80, path, keys=("crash",))["crash"].failure
    assert failure.kind == "lost_previous" and failure.fields["folder"] == "step-00000004", failure

