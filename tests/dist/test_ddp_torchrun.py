"""Lesson 77's reference torchrun job (lesson_code/jobs/ddp_torchrun.py), which the lesson names
but does not run: here it runs on 2 gloo ranks on CPU, as `torchrun --nproc-per-node=2 ... --cpu`."""

import subprocess
import sys

import torch

from lesson_code.models import build_model


def test_the_reference_job_trains_under_torchrun_and_saves_the_bare_model(tmp_path):
    checkpoint = tmp_path / "ddp_job.pt"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                           "-m", "lesson_code.jobs.ddp_torchrun", "--cpu", "--epochs", "1",
                           "--checkpoint", str(checkpoint)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "last micro-batch loss on rank 0" in done.stdout
    state = torch.load(checkpoint)
    assert not any(key.startswith("module.") for key in state)  # saved from model.module
    build_model("gpt", seed=0).load_state_dict(state)  # loads into the bare model
