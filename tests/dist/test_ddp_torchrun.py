"""Lesson 77's reference torchrun job (lesson_code/jobs/ddp_torchrun.py), which the lesson runs on
2 gloo ranks on CPU, as `torchrun --nproc-per-node=2 ... --cpu`; here on 3."""

import signal
import subprocess
import sys

import torch

from lesson_code.models import build_model


def test_the_reference_job_trains_under_torchrun_and_saves_the_bare_model(tmp_path):
    """3 ranks: 21 micro-batches of 4 a rank, so each epoch ends with a step of one micro-batch."""
    checkpoint = tmp_path / "ddp_job.pt"
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=3",
                            "-m", "lesson_code.jobs.ddp_torchrun", "--cpu", "--epochs", "1",
                            "--timeout-s", "60", "--checkpoint", str(checkpoint)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = job.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        job.send_signal(signal.SIGTERM)  # torchrun stops its workers before it exits
        stdout, stderr = job.communicate(timeout=60)
        raise AssertionError(f"the job ran over 300 s:\n{stderr[-2000:]}") from None
    assert job.returncode == 0, stderr[-2000:]
    assert "last micro-batch loss on rank 0" in stdout
    state = torch.load(checkpoint)
    assert not any(key.startswith("module.") for key in state)  # saved from model.module
    build_model("gpt", seed=0).load_state_dict(state)  # loads into the bare model


def test_the_job_exits_2_with_the_fix_when_not_under_torchrun_or_asked_for_missing_gpus(
        monkeypatch, capsys):
    from lesson_code.jobs import ddp_torchrun
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    cases = [(["--cpu"], "start it with torchrun --nproc-per-node=2"),
             (["--cpu", "--epochs", "0"], "0 is not positive")]
    if not torch.cuda.is_available():
        cases.append((["--lang", "fa"], "pass --cpu"))
    for argv, fix in cases:
        if fix == "pass --cpu":
            monkeypatch.setenv("RANK", "0")
            monkeypatch.setenv("WORLD_SIZE", "1")
            monkeypatch.setenv("LOCAL_RANK", "0")
        try:
            ddp_torchrun.main(argv)
        except SystemExit as stop:
            assert stop.code == 2
        else:
            raise AssertionError(f"{argv} did not exit")
        assert fix in capsys.readouterr().err
