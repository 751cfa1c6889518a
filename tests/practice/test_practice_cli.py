"""Practice mode's command line and templates: arguments, the report's shape, a file that is
not one (it does not import, or is another lesson's), one check alone.

main() takes the command's arguments and returns or exits as `python -m lesson_code.practice`
does, so most cases run in this process (the ranks start from its warm fork server instead of a
new interpreter importing torch); the real command runs where the process itself is what is
checked (exit status 2 with usage, and the hang in test_practice_hangs.py)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from lesson_code.practice.cli import main
from lesson_code.practice.lessons import LESSONS
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


def run_cli(*arguments: str) -> subprocess.CompletedProcess:
    """`python -m lesson_code.practice ARGUMENTS` in a real process (its exit status is real)."""
    return subprocess.run([sys.executable, "-m", "lesson_code.practice", *arguments],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


@pytest.mark.parametrize("arguments, named", [
    (["check", "75", "x.py"], "'75' is not a lesson with a practice: choose one of 76, 77, 78, 78a, "
                              "79, 80, 81"),
    (["start", "abc"], "'abc' is not a lesson with a practice: choose one of 76, 77, 78, 78a, 79, 80, "
                       "81"),
    (["check", "76", "no/such/file.py"], "no file at"),
    (["check", "76", __file__, "--timeout", "0"], "'0' is not a number of seconds from 1 to 3600"),
    (["check", "76", __file__, "--timeout", "inf"], "'inf' is not a number of seconds from 1"),
    (["check", "76", __file__, "--timeout", "nan"], "'nan' is not a number of seconds from 1"),
    (["check", "76", __file__, "--timeout", "0.001"], "'0.001' is not a number of seconds"),
    (["check", "76", __file__, "--timeout", "3601"], "'3601' is not a number of seconds"),
    (["check", "76", __file__, "--only", "7"], "lesson 76 has checks 1 to 6, not 7"),
    (["check", "76", __file__, "--only", "x"], "'x' is not a check number"),
    (["start", "76", "--lang", "de"], "invalid choice: 'de'"),
])
def test_bad_arguments_exit_2_with_one_error_line_and_no_traceback(arguments: list[str],
                                                                   named: str, capsys) -> None:
    """In-process, through main(), which exits as the command does (the real command: below)."""
    with pytest.raises(SystemExit) as stopped:
        main(arguments)
    captured = capsys.readouterr()
    assert stopped.value.code == 2 and captured.out == ""
    assert_one_error_line(captured.err, named)


def assert_one_error_line(stderr: str, named: str) -> None:
    errors = [line for line in stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and named in errors[0], stderr
    assert "Traceback" not in stderr


def test_the_real_command_exits_2_and_shows_the_subcommand_s_usage() -> None:
    finished = run_cli("check", "76", "no/such/file.py")
    assert finished.returncode == 2 and finished.stdout == ""
    assert_one_error_line(finished.stderr, "no file at")
    assert finished.stderr.startswith("usage: python -m lesson_code.practice check ")
    assert "python -m lesson_code.practice check: error: no file at" in finished.stderr


def test_a_failing_file_gets_a_report_in_persian_and_exit_1(tmp_path: Path, capsys) -> None:
    path = write_template(76, "fa", tmp_path / "mine.py")
    assert main(["check", "76", str(path), "--lang", "fa"]) == 1
    report = capsys.readouterr().out
    assert "درس ۷۶" in report and "۵ وارسی از ۶ رد شد" in report
    assert "NotImplementedError" in report and "mine.py" in report


def test_a_file_that_does_not_import_ends_the_report_after_check_1(tmp_path: Path, capsys) -> None:
    path = tmp_path / "mine.py"
    path.write_text("def ring_all_reduce(tensor, op='sum', *, group=None):\n"
                    "    return tensor +\n")
    assert main(["check", "76", str(path), "--lang", "fa"]) == 1
    finished = capsys.readouterr()
    report = finished.out
    assert "۱. [رد]" in report and "خطای SyntaxError داد" in report
    assert "وارسی‌های ۲ تا ۶ اجرا نشدند" in report and "۲. [" not in report
    assert report.count("SyntaxError") == 2  # the sentence, and the traceback's last line once
    assert finished.err.count("در حال اجرای") == 1


def test_another_lesson_s_file_is_named_as_such_without_the_grader_s_tracebacks(capsys) -> None:
    learner = Path(__file__).resolve().parent / "solutions" / "collectives_learner.py"
    assert main(["check", "78", str(learner)]) == 1
    report = capsys.readouterr().out
    words = " ".join(report.split())  # the report wraps its lines
    assert ("your file defines ring_all_reduce, ring_reduce_scatter and ring_all_gather of "
            "lesson 76, and no flatten_params") in words
    assert "`python -m lesson_code.practice check 76 ...`" in words
    assert "checks 2 to 6 were not run" in words
    assert "Traceback" not in report and len(report.splitlines()) < 15


def test_only_runs_the_check_it_names(tmp_path: Path, capsys) -> None:
    learner = Path(__file__).resolve().parent / "solutions" / "collectives_learner.py"
    assert main(["check", "76", str(learner), "--only", "4", "--lang", "fa"]) == 0
    report = capsys.readouterr().out
    assert "۴. [قبول] \u2066ring_reduce_scatter\u2069" in report and "۱. [" not in report  # name isolated
    assert report.rstrip().endswith("وارسی ۴ قبول شد.") and "زمان روی" not in report
