"""Every command line rejects a bad argument the argparse way, before any rank starts.

Each case runs the real command (`python -m lesson_code.<module> ...`) in a subprocess: exit
status 2, no traceback, nothing on stdout, and one error line that names the bad value and says
what to pass instead. The checks themselves (lesson_code.harness.cli_args) are tested in-process below.
"""

import argparse
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lesson_code.harness import cli_args

ROOT = Path(__file__).resolve().parents[2]

# (module, arguments, what the error line must contain: the flag and the bad value). All run
# in-process through main(), which exits as the command does; the first case of each command,
# marked SUBPROCESS, also as the real command (about 2 s each: the command imports torch).
SUBPROCESS = True
BAD_ARGUMENTS = [
    ("lesson_code.capstone", ["--accumulation", "0"], "--accumulation: 0 ", SUBPROCESS),
    ("lesson_code.capstone", ["--accumulation", "3"], "--accumulation 3 ", False),
    ("lesson_code.capstone", ["--steps", "-1"], "--steps: -1 ", False),
    ("lesson_code.capstone", ["--steps", "5"], "--checkpoint-step 10 ", False),
    ("lesson_code.capstone", ["--world-size", "0"], "--world-size: 0 ", False),
    ("lesson_code.capstone", ["--lr-spike-step", "21"], "--lr-spike-step 21 ", False),
    ("lesson_code.capstone", ["--seed", "-3"], "--seed: -3 ", False),
    ("lesson_code.capstone", ["--checkpoint-every", "0"], "--checkpoint-every: 0 ", False),
    ("lesson_code.capstone", ["--kill-at-step", "21"], "--kill-at-step 21 ", False),
    ("lesson_code.capstone", ["--kill-at-step", "3", "--kill-rank", "4"], "--kill-rank 4 ", False),
    ("lesson_code.capstone", ["--kill-rank", "1"], "--kill-rank and --kill-during-save need", False),
    ("lesson_code.capstone", ["--kill-at-step", "3", "--kill-during-save"],
     "--kill-during-save: no checkpoint is saved after step 3", False),
    ("lesson_code.capstone.torch_baseline", ["--world-size", "0"], "--world-size: 0 ", SUBPROCESS),
    ("lesson_code.capstone.torch_baseline", ["--world-size", "four"], "--world-size: 'four' ", False),
    ("lesson_code.zero_lab", ["--steps", "0"], "--steps: 0 ", SUBPROCESS),
    ("lesson_code.zero_lab", ["--world-size", "-2"], "--world-size: -2 ", False),
    ("lesson_code.zero_lab", ["--world-size", "25"], "--world-size 25 ", False),
    ("lesson_code.ddp_lab", ["--steps", "0"], "--steps: 0 ", False),
    ("lesson_code.ddp_lab", ["--steps", "2.5"], "--steps: '2.5' ", SUBPROCESS),
    ("lesson_code.ddp_lab", ["--world-size", "17"], "--world-size 17 ", False),
    ("lesson_code.pipeline_lab", ["--world-size", "0"], "--world-size: 0 ", SUBPROCESS),
    ("lesson_code.pipeline_lab", ["--world-size", "5"], "--world-size 5 ", False),
    ("lesson_code.pipeline_lab", ["--world-size", "x"], "--world-size: 'x' ", False),
    ("lesson_code.collectives_lab", ["--length", "0"], "--length: 0 ", SUBPROCESS),
    ("lesson_code.collectives_lab", ["--length", "-7"], "--length: -7 ", False),
    ("lesson_code.collectives_lab", ["--world-size", "0"], "--world-size: 0 ", False),
    ("lesson_code.bench", ["ddp", "--world-size", "0"], "--world-size: 0 ", SUBPROCESS),
    ("lesson_code.bench", ["capstone", "--world-size", "abc"], "--world-size: 'abc' ", False),
]
# Where each command's main() lives (`python -m package` runs the package's __main__).
MAIN_MODULE = {"lesson_code.capstone": "lesson_code.capstone.cli",
               "lesson_code.bench": "lesson_code.bench.__main__"}


def case_id(module: str, arguments: list[str]) -> str:
    return f"{module.split('.', 1)[1]} {' '.join(arguments)}"


def run_command(module: str, arguments: list[str], **environment: str) -> subprocess.CompletedProcess:
    """`python -m module arguments` from the repository root, outside any torchrun."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    return subprocess.run([sys.executable, "-m", module, *arguments], cwd=ROOT, env={**env, **environment},
                          capture_output=True, text=True, timeout=120)


def assert_one_error_line(stderr: str, module: str, needle: str) -> None:
    """argparse's ending: usage, then one "prog: error: ..." line naming the value and the fix."""
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1, stderr
    assert errors[0].startswith(f"python -m {module}: error: "), errors[0]
    assert needle in errors[0] and "pass " in errors[0], errors[0]


def assert_argparse_rejection(completed: subprocess.CompletedProcess, module: str, needle: str) -> None:
    assert completed.returncode == 2, completed.stderr
    assert completed.stdout == "", "the command started work before rejecting its arguments"
    assert_one_error_line(completed.stderr, module, needle)


@pytest.mark.parametrize("module, arguments, needle",
                         [case[:3] for case in BAD_ARGUMENTS if case[3] is SUBPROCESS],
                         ids=[case_id(*case[:2]) for case in BAD_ARGUMENTS if case[3] is SUBPROCESS])
def test_the_command_exits_2_with_one_line_naming_the_value(module, arguments, needle):
    assert_argparse_rejection(run_command(module, arguments), module, needle)


@pytest.mark.parametrize("module, arguments, needle", [case[:3] for case in BAD_ARGUMENTS],
                         ids=[case_id(*case[:2]) for case in BAD_ARGUMENTS])
def test_main_exits_2_before_any_rank_starts(module, arguments, needle, capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    main = importlib.import_module(MAIN_MODULE.get(module, module)).main
    with pytest.raises(SystemExit) as caught:
        main(arguments)
    captured = capsys.readouterr()
    assert caught.value.code == 2 and captured.out == ""
    assert_one_error_line(captured.err, module, needle)


def test_under_torchrun_a_limit_is_checked_against_its_world_size():
    completed = run_command("lesson_code.capstone", ["--kill-at-step", "3", "--kill-rank", "8"],
                            RANK="0", WORLD_SIZE="8")
    assert_argparse_rejection(completed, "lesson_code.capstone", "torchrun's WORLD_SIZE, set by "
                              "torchrun's --nnodes x --nproc-per-node")


def test_the_capstone_accepts_what_the_run_can_do(tmp_path):
    from lesson_code.capstone.cli import parse

    config = parse(["--steps", "5", "--checkpoint-step", "5", "--accumulation", "2",
                    "--world-size", "2", "--seed", "7", "--lr-spike-step", "3",
                    "--out-dir", str(tmp_path)])
    assert (config.steps, config.checkpoint_step, config.accumulation) == (5, 5, 2)
    assert (config.world_size, config.seed, config.lr_spike_step) == (2, 7, 3)
    assert parse(["--world-size", "8", "--out-dir", str(tmp_path)]).world_size == 8  # the corpus grows


@pytest.mark.parametrize("function, text, value", [
    (cli_args.positive_int, "1", 1), (cli_args.positive_int, "+12", 12),
    (cli_args.non_negative_int, "0", 0), (cli_args.seed_int, str(cli_args.SEED_MAX), cli_args.SEED_MAX),
])
def test_type_functions_return_the_int(function, text, value):
    assert function(text) == value


@pytest.mark.parametrize("function, text, shown, fix", [
    (cli_args.positive_int, "0", "0 is not positive", "1 or more"),
    (cli_args.positive_int, "-4", "-4 is not positive", "1 or more"),
    (cli_args.positive_int, "2.5", "'2.5' is not a whole number", "such as 4"),
    (cli_args.positive_int, "", "'' is not a whole number", "such as 4"),
    (cli_args.non_negative_int, "-1", "-1 is negative", "0 or more"),
    (cli_args.non_negative_int, "one", "'one' is not a whole number", "such as 4"),
    (cli_args.seed_int, "-1", "-1 is not a seed", f"0 to {cli_args.SEED_MAX}"),
    (cli_args.seed_int, str(cli_args.SEED_MAX + 1), f"{cli_args.SEED_MAX + 1} is not a seed",
     f"0 to {cli_args.SEED_MAX}"),
])
def test_type_functions_name_the_value_and_the_fix(function, text, shown, fix):
    with pytest.raises(argparse.ArgumentTypeError) as caught:
        function(text)
    message = str(caught.value)
    assert message.startswith(shown) and "pass " in message and fix in message, message


def rejection(check, *args, capsys) -> str:
    """The error line `check(parser, *args)` prints; fails unless it exits with status 2."""
    parser = argparse.ArgumentParser(prog="prog")
    with pytest.raises(SystemExit) as caught:
        check(parser, *args)
    assert caught.value.code == 2
    return capsys.readouterr().err.splitlines()[-1]


def test_cross_argument_checks_pass_good_values():
    parser = argparse.ArgumentParser(prog="prog")
    cli_args.check_at_most(parser, "--world-size", 4, 4, "reason")
    cli_args.check_in_range(parser, "--checkpoint-step", 20, 1, 20, "reason")
    cli_args.check_divides(parser, "--accumulation", 2, 4, "the batch")


def test_cross_argument_checks_name_the_value_and_the_fix(capsys):
    line = rejection(cli_args.check_at_most, "--world-size", 5, 4, "too few layers", capsys=capsys)
    assert line == "prog: error: --world-size 5 is too large: too few layers, so pass at most 4"
    line = rejection(cli_args.check_in_range, "--checkpoint-step", 0, 1, 20, "why", capsys=capsys)
    assert line == "prog: error: --checkpoint-step 0 is outside 1..20: why, so pass a value from 1 to 20"
    line = rejection(cli_args.check_divides, "--accumulation", 4, 6, "the batch", capsys=capsys)
    assert line == "prog: error: --accumulation 4 does not divide the batch (6): pass one of 1, 2, 3, 6"


def test_world_size_in_use_follows_torchrun(monkeypatch, capsys):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert cli_args.world_size_in_use(3) == (3, "--world-size")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "6")
    assert cli_args.world_size_in_use(3) == (6, "torchrun's WORLD_SIZE")
    line = rejection(cli_args.check_world_size, 4, 4, "the reason", capsys=capsys)
    assert line == "prog: error: torchrun's WORLD_SIZE 6 is too large: the reason, so pass at most 4"
