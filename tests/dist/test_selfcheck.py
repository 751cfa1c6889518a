"""`python -m lesson_code.selfcheck` (make selfcheck): one line per check, on this machine's CPU."""

import os
import subprocess
import sys

import torch


def selfcheck(*arguments):
    environment = dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR")
    return subprocess.run([sys.executable, "-m", "lesson_code.selfcheck", *arguments],
                          env=environment, capture_output=True, text=True, timeout=600)


def test_every_lesson_passes_its_check_on_gloo():
    completed = selfcheck("--backend", "gloo")
    assert completed.returncode == 0, completed.stdout + completed.stderr[-3000:]
    lines = completed.stdout.splitlines()
    assert [line.split()[1] for line in lines] == ["76", "77", "78", "78", "79", "80", "81"]
    assert "ZeRO-3" in lines[3] and "FSDP2" in lines[3], lines[3]
    assert all(" PASS  gloo x4 on cpu " in line for line in lines), completed.stdout


def test_a_backend_the_machine_lacks_is_a_failure_not_a_pass():
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    completed = selfcheck("--backend", "nccl", "--world-size", str(gpus + 1), "--lessons", "76")
    assert completed.returncode == 1
    assert " FAIL " in completed.stdout and "needs one CUDA device per rank" in completed.stdout


def test_bad_arguments_exit_2_without_a_traceback():
    completed = selfcheck("--world-size", "0")
    assert completed.returncode == 2 and "Traceback" not in completed.stderr
