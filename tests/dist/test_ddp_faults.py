"""Lesson 77's wrappers and the communicator when something goes wrong, on real gloo ranks.

Each rank function catches the error it expects and returns what it saw and how long it took,
so a test can check every rank, not only the first to fail.
"""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from lesson_code import launch
from lesson_code.collectives.comm import KINDS, Communicator
from lesson_code.ddp import BucketedDDP, NaiveDDP

WRAPPERS = {"naive": NaiveDDP, "bucketed": lambda m: BucketedDDP(m, bucket_cap_mb=1e-6)}


# --- rank functions (module level, so spawned ranks can import them) -------------------------

def unknown_ops(rank, world_size, kind):
    comm = Communicator(kind)
    seen = []
    for call in (comm.all_reduce, comm.all_reduce_async, comm.reduce_scatter):
        try:
            call(torch.ones(4), op="max")
            seen.append("accepted")
        except ValueError as error:
            seen.append(str(error))
    comm.close()
    return seen


class FailingBackward(torch.autograd.Function):
    """Identity forward; its backward raises while `module.fail` is set (one bad backward)."""

    @staticmethod
    def forward(ctx, x, module):
        ctx.module = module
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if ctx.module.fail:
            ctx.module.fail = False
            raise RuntimeError("backward fails once on purpose")
        return grad, None


class FailsOnce(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.last, self.fail = nn.Linear(4, 4), nn.Linear(4, 1), True

    def forward(self, x):
        return self.last(FailingBackward.apply(self.first(x), self))


def step_after_a_failed_backward(rank, world_size, wrapper):
    torch.manual_seed(0)
    model = WRAPPERS[wrapper](FailsOnce())
    x = torch.full((2, 4), float(rank + 1))
    try:  # the hooks of `last` have fired when `first`'s backward raises
        model(x).sum().backward()
    except RuntimeError as error:
        assert "on purpose" in str(error)
    for param in model.parameters():
        param.grad = None
    model(x).sum().backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.module.parameters()])
    everyone = [torch.empty_like(grads) for _ in range(world_size)]
    dist.all_gather(everyone, grads)
    return {"grads": grads, "same_on_every_rank": all(torch.equal(g, grads) for g in everyone)}


def unused_on_rank_zero_only(rank, world_size, wrapper):
    model = WRAPPERS[wrapper](nn.ModuleDict({"a": nn.Linear(4, 1), "b": nn.Linear(4, 1)}))
    x = torch.ones(2, 4)
    start = time.monotonic()
    try:
        out = model.module["a"](x) if rank == 0 else model.module["a"](x) + model.module["b"](x)
        out.sum().backward()
    except RuntimeError as error:
        return {"error": str(error), "seconds": time.monotonic() - start}
    return {"error": None, "seconds": time.monotonic() - start}


def reduce_after_a_timeout(rank, world_size):
    comm = Communicator("ring", timeout_s=3, algorithm="ring")  # no agreement: rank 1 never joins
    seen = {}
    if rank == 0:  # rank 1 never joins this reduction, so its wait times out
        pending = comm.all_reduce_async(torch.ones(8))
        try:
            pending.wait(timeout_s=0.5)
        except TimeoutError as error:
            seen["timeout"] = str(error)
        for name, call in (("async", comm.all_reduce_async), ("sync", comm.all_reduce)):
            start = time.monotonic()
            try:
                call(torch.ones(8))
                seen[name] = "accepted"
            except RuntimeError as error:
                seen[name] = str(error)
            seen[name + "_s"] = time.monotonic() - start
    else:
        time.sleep(2.0)  # alive, but not in the reduction: rank 0's wait times out
    return seen


# --- tests ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_an_unknown_reduction_op_is_refused_by_both_kinds(kind):
    seen = launch.spawn(unknown_ops, kind, world_size=2, timeout_s=60)[0]
    assert len(seen) == 3
    for message in seen:
        assert "'max'" in message and "'sum'" in message and "'avg'" in message, seen


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
def test_a_failed_backward_does_not_stop_the_next_step_from_synchronising(wrapper):
    results = launch.spawn(step_after_a_failed_backward, wrapper, world_size=2, timeout_s=60)
    assert all(r["same_on_every_rank"] for r in results), [r["grads"] for r in results]


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
def test_a_gradient_missing_on_one_rank_raises_the_same_error_on_every_rank(wrapper):
    results = launch.spawn(unused_on_rank_zero_only, wrapper, world_size=2, timeout_s=60)
    errors = [r["error"] for r in results]
    assert errors[0] is not None and errors[0] == errors[1], errors
    # The same error on both ranks (not a TimeoutError on rank 1): no rank waited for a peer.
    assert "rank 0" in errors[0] and "b.weight" in errors[0] and "received no gradient" in errors[0]


def test_a_timed_out_ring_reduce_breaks_the_communicator_for_later_calls():
    seen = launch.spawn(reduce_after_a_timeout, world_size=2, timeout_s=60)[0]
    assert "timeout" in seen, seen
    for name in ("async", "sync"):
        # Refused with the reason, not run (async) or failed by a later ring timeout (sync).
        assert "communicator" in seen[name] and "timed out" in seen[name], seen


def test_a_process_exits_at_once_after_its_ring_reduce_timed_out():
    """The reduction's thread stays blocked in its receive (the ring waits 120 s) after the
    caller's 1 s wait gave up: a worker started as torchrun starts it must still exit at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    script = Path(__file__).with_name("ring_timeout_exit.py")
    workers = [subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                 LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                 TORCH_CPP_LOG_LEVEL="ERROR")) for rank in (0, 1)]
    try:
        out, err = workers[0].communicate(timeout=60)  # start-up, then 1 s: not 120 s
        assert "waiting" in out, err[-2000:]
        assert workers[0].returncode == 1 and "TimeoutError" in err, err[-2000:]
    finally:
        for worker in workers:
            worker.kill()
            worker.communicate()
