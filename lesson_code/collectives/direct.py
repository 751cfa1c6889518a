"""Reduce-scatter, all-gather and all-reduce in one round of messages: the direct algorithms (lesson 76).

A ring takes N - 1 steps for a reduce-scatter and N - 1 for an all-gather, one after the other,
because each step forwards what the last one received. The direct algorithms send the same bytes
in one round: every rank sends chunk j of its tensor straight to rank j, which adds the N - 1
copies it receives (reduce-scatter); then every rank sends its reduced chunk to every other rank
(all-gather). Each rank still sends (N-1)/N of the tensor per phase, the ring's bytes, and all
N - 1 messages of a phase are in flight at once. Whether the phase then costs one message's
latency or N - 1 depends on the network: if the latencies overlap, an all-reduce costs about
2 alpha + 2 (N-1)/N n beta; if each message pays its alpha at the sender in turn (the one-port
model, which `cost_model` uses), it costs the ring's 2 (N-1) alpha + 2 (N-1)/N n beta. (These are
the "linear" or "scattered" algorithms of MPICH; NCCL's all-to-all works alike.)
What they give up: N - 1 messages in flight per rank, which a real network with many ranks
serialises at each rank's link, so rings and trees win at scale and for long messages there.

Chunking follows `torch.tensor_split(tensor, N)` along dim 0, as in `ring`. Each chunk is reduced
by its one owner, so every rank ends with bitwise the same all-reduce result.

    from lesson_code.collectives import direct
    direct.direct_reduce_scatter(tensor, "sum")       # call on every rank
    direct.direct_all_gather(shard, sizes)
    direct.direct_all_reduce(tensor, "sum")           # in place
"""

from __future__ import annotations

import torch

from lesson_code.collectives.ledger import CommLedger
from lesson_code.collectives.p2p import DEFAULT_WAIT_S, Peers
from lesson_code.collectives.ring import (check_op, contiguous_in_place, gather_output,
                                          peers_for)

# The receive buffers of one reduce-scatter hold at most this many bytes, reused segment after
# segment. Kept under glibc's largest mmap threshold (32 MiB): a larger buffer is a fresh mapping
# on every call, and touching it page by page cost more than the reduction (64 MiB: 30 ms here).
RECEIVE_BUFFER_BYTES = 24 * 1024 * 1024


def _segment_elements(chunk: torch.Tensor, peers: Peers) -> int:
    """Elements per message when `chunk` travels in the reduce-scatter (at least 1).

    Sized so that the receiver's N - 1 buffers fit RECEIVE_BUFFER_BYTES; sender and receiver
    compute it from the same chunk, so they cut it into the same messages. NCCL posts a whole
    round as one group, so there a chunk is one message.
    """
    if peers.batched:
        return max(1, chunk.numel())
    budget = RECEIVE_BUFFER_BYTES // (chunk.element_size() * max(peers.world_size - 1, 1))
    return max(1, min(chunk.numel(), budget))


def _scatter_reduce_into(peers: Peers, chunks: tuple[torch.Tensor, ...],
                         out: torch.Tensor) -> None:
    """Add every other rank's chunk `peers.rank` into `out` (flat); send chunk j to rank j.

    Sends go right (r+1, r+2, ...) and receives come from the left (r-1, r-2, ...), so the rank
    each message is addressed to first is the one that expects it first. A long chunk travels as
    segments through one set of receive buffers: receive segment k from everyone, add, then k+1.
    """
    rank, world_size = peers.rank, peers.world_size
    senders = [(rank - k) % world_size for k in range(1, world_size)]
    step = _segment_elements(out, peers)
    buffers = out.new_empty((world_size - 1, min(step, out.numel())))
    outgoing, sending = _outgoing(peers, chunks), []
    for start in range(0, max(out.numel(), 1), step):  # once even for an empty chunk: it sends
        width = min(step, out.numel() - start)
        recvs = [(buffers[row, :width], source) for row, source in enumerate(senders)]
        if peers.batched:  # one segment: the whole round is one NCCL group
            peers.post_together(recvs, outgoing)
        else:
            receiving = [peers.post_recv(tensor, source) for tensor, source in recvs]
            if start == 0:  # all outgoing segments at once, behind the first receives
                sending = [peers.post_send(tensor, dest) for tensor, dest in outgoing]
            for work in receiving:
                peers.wait_all([work])
        for row in range(world_size - 1):  # in a fixed order, the same on every call
            out[start: start + width].add_(buffers[row, :width])
    peers.wait_all(sending)


def _outgoing(peers: Peers, chunks: tuple[torch.Tensor, ...]) -> list[tuple[torch.Tensor, int]]:
    """(segment, destination) of every chunk but this rank's own, cut as its owner cuts it."""
    messages = []
    for k in range(1, peers.world_size):
        dest = (peers.rank + k) % peers.world_size
        flat = chunks[dest].reshape(-1)
        step = _segment_elements(flat, peers)
        messages += [(flat[start: start + step], dest) for start in range(0, flat.numel(), step)]
    return messages


def _gather_into(peers: Peers, chunks: tuple[torch.Tensor, ...]) -> None:
    """Chunk `peers.rank` is filled: send it to every rank, receive every other chunk in place."""
    rank, world_size = peers.rank, peers.world_size
    recvs = [(chunks[(rank - k) % world_size], (rank - k) % world_size)
             for k in range(1, world_size)]
    sends = [(chunks[rank], (rank + k) % world_size) for k in range(1, world_size)]
    peers.post_together(recvs, sends)


def direct_reduce_scatter(tensor: torch.Tensor, op: str = "sum", *, group=None,
                          ledger: CommLedger | None = None,
                          timeout_s: float = DEFAULT_WAIT_S) -> torch.Tensor:
    """Return this rank's chunk of the reduction of `tensor`, in one round; `tensor` is unchanged.

    Collective: call on every rank with tensors of the same shape and dtype. Rank r gets the
    reduced `torch.tensor_split(tensor, N)[r]` (dim 0), a new tensor, as `ring_reduce_scatter`
    gives it. Each rank sends (N-1)/N of the tensor's bytes: N - 1 messages, all at once.
    Raises ValueError for an unknown op, or op="avg" on an integer tensor.
    """
    check_op(op, tensor)
    peers = peers_for("reduce_scatter", group, ledger, timeout_s)
    chunks = torch.tensor_split(tensor.contiguous(), peers.world_size)
    own = chunks[peers.rank].clone()
    _scatter_reduce_into(peers, chunks, own.view(-1))
    if op == "avg":
        own.div_(peers.world_size)
    peers.counter.commit()
    return own


def direct_all_gather(shard: torch.Tensor, sizes: list[int] | None = None, *, group=None,
                      ledger: CommLedger | None = None,
                      timeout_s: float = DEFAULT_WAIT_S) -> torch.Tensor:
    """Return every rank's `shard` concatenated along dim 0 in rank order, in one round.

    Collective: call on every rank; arguments and errors as `ring_all_gather` (shards may differ
    in length along dim 0; `sizes[r]` is rank r's length, exchanged first when None). Each rank
    sends its shard to each of the N - 1 others at once and receives theirs in place.
    """
    peers = peers_for("all_gather", group, ledger, timeout_s)
    output, chunks = gather_output(shard, sizes, peers, group, ledger, timeout_s)
    _gather_into(peers, chunks)
    peers.counter.commit()
    return output


def direct_all_reduce(tensor: torch.Tensor, op: str = "sum", *, group=None,
                      ledger: CommLedger | None = None,
                      timeout_s: float = DEFAULT_WAIT_S) -> torch.Tensor:
    """Reduce `tensor` over all ranks in place: a direct reduce-scatter, then a direct all-gather.

    Collective: call on every rank with tensors of the same shape and dtype. Two rounds of N - 1
    messages, moving the ring's 2(N-1)/N of the tensor per rank. Each chunk is reduced in place
    by its owner, so no copy of the tensor is made. Raises ValueError for an unknown op, or
    op="avg" on an integer tensor.
    """
    check_op(op, tensor)
    peers = peers_for("all_reduce", group, ledger, timeout_s)
    with contiguous_in_place(tensor) as work:
        chunks = torch.tensor_split(work.view(-1), peers.world_size)
        own = chunks[peers.rank]
        _scatter_reduce_into(peers, chunks, own)
        if op == "avg":
            own.div_(peers.world_size)
        _gather_into(peers, chunks)
    peers.counter.commit()
    return tensor
