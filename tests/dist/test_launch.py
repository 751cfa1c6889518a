"""launch.spawn and launch.run: results by rank, failures that end quickly, nothing left behind."""

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist

from lesson_code import launch

ROOT = Path(__file__).resolve().parents[2]


# --- rank functions (module level, so spawned ranks can import them) -------------------------

def report_identity(rank, world_size, pid_dir):
    Path(pid_dir, str(rank)).write_text(str(os.getpid()))
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    return {"rank": rank, "world_size": world_size, "sum": total.item(),
            "threads": torch.get_num_threads(),
            "log_level": os.environ.get("TORCH_CPP_LOG_LEVEL"),
            "tensor": torch.arange(3) * rank}


def raise_on_rank_one(rank, world_size, pid_dir):
    Path(pid_dir, str(rank)).write_text(str(os.getpid()))
    if rank == 1:
        raise ZeroDivisionError("rank one divides by zero on purpose")
    dist.all_reduce(torch.zeros(1))  # the others block here, waiting for rank 1
    return rank


def hang_on_rank_two(rank, world_size, pid_dir):
    Path(pid_dir, str(rank)).write_text(str(os.getpid()))
    if rank == 2:
        time.sleep(3600)
    return rank


def send_first(rank, world_size, pid_dir):
    Path(pid_dir, str(rank)).write_text(str(os.getpid()))
    message = torch.zeros(1 << 20)  # 4 MiB: a blocking send waits for its receive
    dist.send(message, (rank + 1) % world_size)
    dist.recv(message, (rank - 1) % world_size)
    return rank


def abort_on_rank_three(rank, world_size, pid_dir):
    Path(pid_dir, str(rank)).write_text(str(os.getpid()))
    if rank == 3:
        os.abort()
    dist.barrier()
    return rank


# --- helpers --------------------------------------------------------------------------------

def rank_pids(pid_dir):
    return [int(p.read_text()) for p in Path(pid_dir).iterdir()]


def assert_nothing_left(pid_dir):
    """Every rank process is gone; the caller's only children are multiprocessing's helpers."""
    for pid in rank_pids(pid_dir):
        alive = psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        assert not alive, f"rank process {pid} survived spawn"
    for child in psutil.Process().children(recursive=True):
        cmdline = " ".join(child.cmdline())
        assert "forkserver" in cmdline or "resource_tracker" in cmdline, (
            f"unexpected child process left behind: {child.pid} {cmdline}")


# --- tests ----------------------------------------------------------------------------------

def test_results_come_back_by_rank(tmp_path):
    log_level_before = os.environ.get("TORCH_CPP_LOG_LEVEL")
    results = launch.spawn(report_identity, str(tmp_path), world_size=4)
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    assert all(r["world_size"] == 4 and r["sum"] == 6.0 for r in results)
    assert all(r["threads"] == 1 and r["log_level"] == "ERROR" for r in results)
    # Tensors come back by value and stay valid after the ranks have exited.
    assert torch.equal(results[3]["tensor"], torch.tensor([0, 3, 6]))
    assert_nothing_left(tmp_path)
    assert os.environ.get("TORCH_CPP_LOG_LEVEL") == log_level_before  # the caller's env is restored


def test_a_raising_rank_is_named_with_its_traceback(tmp_path):
    # The others block in a collective: had the launcher waited for them, the call would have
    # ended at timeout_s with RankTimeoutError. (How long it takes: python -m lesson_code.bench launch.)
    with pytest.raises(launch.RankFailedError) as caught:
        launch.spawn(raise_on_rank_one, str(tmp_path), world_size=4, timeout_s=120)
    error = caught.value
    assert error.rank == 1
    assert "rank 1 of 4" in str(error)
    assert "ZeroDivisionError: rank one divides by zero on purpose" in str(error)
    assert "raise_on_rank_one" in error.rank_traceback
    assert_nothing_left(tmp_path)


def test_a_hanging_rank_ends_the_call_at_the_timeout(tmp_path):
    start = time.monotonic()
    with pytest.raises(launch.RankTimeoutError) as caught:
        launch.spawn(hang_on_rank_two, str(tmp_path), world_size=4, timeout_s=3)
    assert time.monotonic() - start >= 3  # not before the timeout
    assert caught.value.ranks == [2]
    assert "ranks [2] of 4" in str(caught.value)
    assert_nothing_left(tmp_path)


def test_a_hang_is_explained_by_the_calls_the_ranks_wait_in(tmp_path):
    with pytest.raises(launch.RankTimeoutError) as caught:
        launch.spawn(send_first, str(tmp_path), world_size=2, timeout_s=3)
    where = caught.value.where
    assert sorted(where) == [0, 1], where
    assert all(calls[0].startswith("send (torch/distributed/") and "send_first (test_launch.py:"
               in calls[1] for calls in where.values()), where
    hint = str(caught.value).splitlines()[-1]
    assert hint.startswith("Every rank waits in a blocking dist.send"), hint
    assert "blocking dist.recv" not in hint
    assert_nothing_left(tmp_path)


def test_a_crashing_rank_is_reported_with_its_signal(tmp_path):
    with pytest.raises(launch.RankCrashedError) as caught:
        launch.spawn(abort_on_rank_three, str(tmp_path), world_size=4, timeout_s=60)
    assert caught.value.rank == 3
    assert "SIGABRT" in str(caught.value)
    assert_nothing_left(tmp_path)


def test_the_spawn_start_method_also_works_and_leaves_nothing(tmp_path):
    results = launch.spawn(report_identity, str(tmp_path), world_size=2, start_method="spawn")
    assert [r["sum"] for r in results] == [1.0, 1.0]
    assert_nothing_left(tmp_path)


@pytest.mark.parametrize("world_size", [0, -1, 2.0, True, "4", None])
def test_bad_world_size_names_the_value(world_size):
    with pytest.raises(ValueError, match="world_size must be a positive int") as caught:
        launch.spawn(report_identity, "/nonexistent", world_size=world_size)
    assert repr(world_size) in str(caught.value)


def test_unknown_backend_and_missing_gpus_are_explained():
    with pytest.raises(ValueError, match="unknown backend 'mpi'"):
        launch.spawn(report_identity, "/nonexistent", world_size=2, backend="mpi")
    if torch.cuda.device_count() < 64:
        with pytest.raises(ValueError, match="needs one CUDA device per rank"):
            launch.spawn(report_identity, "/nonexistent", world_size=64, backend="nccl")


def test_auto_backend_is_gloo_without_enough_gpus():
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert launch.resolve_backend("auto", gpus + 1) == "gloo"


def test_init_from_env_requires_torchrun(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ValueError, match="torchrun"):
        launch.init_from_env()


def test_a_lesson_module_runs_unchanged_under_torchrun():
    torchrun = Path(sys.executable).with_name("torchrun")
    environment = dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR", OMP_NUM_THREADS="1")
    completed = subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node=2", "-m", "lesson_code.collectives_lab",
         "--length", "37"],
        cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "2 ranks" in completed.stdout
    assert "all results equal the built-ins" in completed.stdout
    assert completed.stdout.count("all results equal the built-ins") == 1  # rank 0 reports


def test_functions_the_ranks_cannot_import_are_refused_up_front():
    with pytest.raises(ValueError, match="cannot be imported by the rank processes"):
        launch.spawn(lambda rank, world_size: rank, world_size=2)

    def nested(rank, world_size):
        return rank

    with pytest.raises(ValueError, match="top level of a module"):
        launch.spawn(nested, world_size=2)
