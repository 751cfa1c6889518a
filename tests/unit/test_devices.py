"""Backend choice, the rank's device, results returned on the CPU, references in one rank."""

import pytest
import torch

from lesson_code.runtime import devices
from lesson_code.harness.reference import in_one_rank


def test_auto_is_gloo_without_a_gpu_per_rank_and_follows_the_environment(monkeypatch):
    monkeypatch.delenv(devices.BACKEND_VARIABLE, raising=False)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert devices.resolve_backend("auto", gpus + 1) == "gloo"
    monkeypatch.setenv(devices.BACKEND_VARIABLE, "gloo")
    assert devices.resolve_backend("auto", 1) == "gloo"
    assert devices.resolve_backend("gloo", 1) == "gloo"
    monkeypatch.setenv(devices.BACKEND_VARIABLE, "mpi")
    with pytest.raises(ValueError, match="LESSON_CODE_BACKEND='mpi' is not a backend"):
        devices.resolve_backend("auto", 1)


def test_nccl_without_a_gpu_per_rank_is_refused_with_the_fix():
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ValueError, match="needs one CUDA device per rank.*backend='gloo'"):
        devices.resolve_backend("nccl", gpus + 1)


def test_outside_a_process_group_the_device_is_the_cpu():
    assert devices.current_device() == torch.device("cpu")


def test_results_come_back_on_the_cpu_with_their_structure():
    result = {"a": [torch.ones(2), (torch.zeros(1), 3)], "b": "text"}
    moved = devices.to_cpu(result)
    assert moved["b"] == "text" and isinstance(moved["a"][1], tuple)
    assert torch.equal(moved["a"][0], torch.ones(2)) and moved["a"][0].device.type == "cpu"


def test_a_reference_runs_with_one_thread_whatever_the_caller_uses():
    saved = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        assert in_one_rank(torch.get_num_threads) == 1
    finally:
        torch.set_num_threads(saved)


def test_a_reference_function_the_rank_cannot_import_is_refused():
    with pytest.raises(ValueError, match="cannot be imported by the rank processes"):
        in_one_rank(lambda: 1)
