"""Practice mode's command line, templates, words and its handling of a learner's hang."""

import ast
import subprocess
import sys
import time
from pathlib import Path

import pytest

from practice_helpers import grade
from lesson_code.practice.cli import main
from lesson_code.practice.lessons import LESSONS
from lesson_code.practice.messages import FAILURES, HEADINGS
from lesson_code.practice.templates import template_path, write_template

ROOT = Path(__file__).resolve().parents[2]


def signatures(path: Path) -> dict[str, str]:
    """Every top-level function or class of a file, with its arguments: name -> dumped arguments."""
    tree = ast.parse(path.read_text())
    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            found[node.name] = ast.dump(node.args)
        elif isinstance(node, ast.ClassDef):
            found[node.name] = sorted(ast.dump(item.args) + item.name for item in node.body
                                      if isinstance(item, ast.FunctionDef))
    return found


@pytest.mark.parametrize("number", sorted(LESSONS))
def test_both_templates_of_a_lesson_define_its_names_with_the_same_signatures(number: int) -> None:
    english, persian = template_path(number, "en"), template_path(number, "fa")
    assert signatures(english) == signatures(persian)
    assert set(LESSONS[number].names) <= set(signatures(english))
    assert "NotImplementedError" in english.read_text()
    assert "۰" not in english.read_text() and any(c in persian.read_text() for c in "۱۲۳۴۵۶۷۸۹")


def test_start_writes_the_template_and_refuses_to_replace_a_file(tmp_path: Path, capsys) -> None:
    out = tmp_path / "mine.py"
    assert main(["start", "76", "--lang", "fa", "--out", str(out)]) == 0
    assert f"check 76 {out} --lang fa" in capsys.readouterr().out
    assert f"check 76 {out} --lang fa" in out.read_text()
    out.write_text("# my work\n")
    with pytest.raises(SystemExit) as stopped:
        main(["start", "76", "--out", str(out)])
    assert stopped.value.code == 2 and out.read_text() == "# my work\n"
    assert "--force" in capsys.readouterr().err
    assert main(["start", "76", "--out", str(out), "--force"]) == 0
    assert "def ring_all_reduce" in out.read_text()


@pytest.mark.parametrize("arguments, named", [
    (["check", "75", "x.py"], "lesson 75 has no practice"),
    (["check", "76", "no/such/file.py"], "no file at"),
    (["check", "76", __file__, "--timeout", "0"], "'0' is not a positive number"),
    (["start", "76", "--lang", "de"], "invalid choice: 'de'"),
])
def test_bad_arguments_exit_2_with_one_line_and_no_traceback(arguments: list[str], named: str) -> None:
    finished = subprocess.run([sys.executable, "-m", "lesson_code.practice", *arguments],
                              capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert finished.returncode == 2
    assert named in finished.stderr and "Traceback" not in finished.stderr


def test_every_failure_reads_in_both_languages_with_the_same_fields() -> None:
    import string

    def fields(text: str) -> set[str]:
        return {name for _, name, _, _ in string.Formatter().parse(text) if name}

    assert FAILURES["en"].keys() == FAILURES["fa"].keys()
    assert HEADINGS["en"].keys() == HEADINGS["fa"].keys()
    for table in (FAILURES, HEADINGS):
        for key in table["en"]:
            assert fields(table["en"][key]) == fields(table["fa"][key]), key


def test_a_failing_file_gets_a_report_in_persian_and_exit_1(tmp_path: Path, capsys) -> None:
    path = write_template(76, "fa", tmp_path / "mine.py")
    assert main(["check", "76", str(path), "--lang", "fa"]) == 1
    report = capsys.readouterr().out
    assert "درس ۷۶" in report and "۵ بررسی از ۶ رد شد" in report
    assert "NotImplementedError" in report and "mine.py" in report


def test_a_learner_function_that_hangs_is_reported_within_the_timeout(tmp_path: Path) -> None:
    path = tmp_path / "hangs.py"
    path.write_text("import torch.distributed as dist\n\n\n"
                    "def ring_all_reduce(tensor, op='sum', *, group=None, timeout_s=30.0):\n"
                    "    rank, size = dist.get_rank(), dist.get_world_size()\n"
                    "    if size > 1:\n"
                    "        dist.recv(tensor, (rank - 1) % size)  # every rank waits: a deadlock\n"
                    "    return tensor\n")
    started = time.monotonic()
    failure = grade(76, path, keys=("all_reduce_sum",), timeout_s=5.0)["all_reduce_sum"].failure
    assert failure.kind == "timeout" and failure.fields["case"] == "world_size=2"
    assert time.monotonic() - started < 30
