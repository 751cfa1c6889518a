"""A learner's lesson 76 file, written as a learner would: the three ring collectives from isend/irecv.

The practice tests grade it as it is (every check passes) and with one mistake each (the
variants of tests/practice/test_collectives.py), to show that each check catches its mistake.
"""

from datetime import timedelta

import torch
import torch.distributed as dist

DEFAULT_WAIT_S = 30.0


def _step(send: torch.Tensor, recv: torch.Tensor, group, timeout_s: float) -> None:
    """Send `send` to the right neighbour while receiving `recv` from the left one."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    right = dist.get_global_rank(group, (rank + 1) % size) if group else (rank + 1) % size
    left = dist.get_global_rank(group, (rank - 1) % size) if group else (rank - 1) % size
    works = [dist.isend(send.contiguous(), right, group=group),
             dist.irecv(recv, left, group=group)]
    for work in works:
        work.wait(timedelta(seconds=timeout_s))


def _reduce_scatter(chunks, rank: int, size: int, group, timeout_s: float) -> torch.Tensor:
    """The sum over ranks of chunk `rank`, after N - 1 steps around the ring."""
    partial = chunks[(rank - 1) % size].clone()
    for step in range(1, size):  # the lesson's steps k = 1 .. N - 1: receive chunk r - k - 1
        index = (rank - step - 1) % size
        received = torch.empty_like(chunks[index])
        _step(partial, received, group, timeout_s)
        partial = received + chunks[index]
    return partial


def _all_gather(chunks, rank: int, size: int, group, timeout_s: float) -> None:
    """Fill every chunk from its owner, forwarding around the ring for N - 1 steps."""
    for step in range(1, size):  # send chunk r - k + 1, receive chunk r - k
        _step(chunks[(rank - step + 1) % size], chunks[(rank - step) % size], group, timeout_s)


def ring_all_reduce(tensor, op="sum", *, group=None, timeout_s=DEFAULT_WAIT_S):
    if op == "avg" and not tensor.is_floating_point():
        raise ValueError(f"op='avg' on {tensor.dtype} would truncate")
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    flat = tensor.view(-1)
    chunks = torch.tensor_split(flat, size)
    own = _reduce_scatter(chunks, rank, size, group, timeout_s) if size > 1 else chunks[0].clone()
    if op == "avg":
        own = own / size
    chunks[rank].copy_(own)
    _all_gather(chunks, rank, size, group, timeout_s)
    return tensor


def ring_reduce_scatter(tensor, op="sum", *, group=None, timeout_s=DEFAULT_WAIT_S):
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    chunks = torch.tensor_split(tensor.reshape(-1), size)
    own = _reduce_scatter(chunks, rank, size, group, timeout_s) if size > 1 else chunks[0].clone()
    return own / size if op == "avg" else own


def ring_all_gather(shard, sizes=None, *, group=None, timeout_s=DEFAULT_WAIT_S):
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    output = shard.new_empty((sum(sizes), *shard.shape[1:]))
    chunks = torch.split(output, sizes)
    chunks[rank].copy_(shard)
    _all_gather(chunks, rank, size, group, timeout_s)
    return output
