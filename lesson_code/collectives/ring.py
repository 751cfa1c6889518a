"""Collective primitives built from point-to-point messages (lesson 76).

Ring all-reduce, ring reduce-scatter, ring all-gather and a binomial-tree broadcast, each made of
nothing but `isend`/`irecv` between neighbouring ranks, every wait bounded by `timeout_s`. A naive
all-reduce (gather to rank 0, reduce, send back) stands beside the ring for contrast. Each primitive
can record its traffic in a `CommLedger`, which is how the lesson shows that a reduce-scatter plus an
all-gather moves exactly the bytes of one all-reduce: 2(N-1)/N x size per rank.

Chunking follows `torch.tensor_split(tensor, N)` along dim 0: chunk r belongs to rank r, so chunks
may differ by one row when N does not divide the length, and may be empty when N exceeds it.

The lesson's checks, timings and ledgers of these primitives are in `lesson_code.collectives_lab`;
run the checks on 4 ranks from a shell, or under torchrun:

    python -m lesson_code.collectives_lab
    torchrun --standalone --nproc-per-node=4 -m lesson_code.collectives_lab

Floating-point sums: a ring adds the N contributions to a chunk in an order that depends on the
chunk's position in the ring, and gloo's built-in all-reduce uses its own order. Float addition is
not associative, so results may differ from the built-in in the last bits (relative 1e-6 for
float32 at N <= 5, a few ulps); integer sums are exact.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from lesson_code.collectives.ledger import CommLedger, TrafficCounter
from lesson_code.collectives.p2p import DEFAULT_WAIT_S, Peers
from lesson_code.harness.validate import require_choice

OPS = ("sum", "avg")


def check_op(op: str, tensor: torch.Tensor) -> None:
    """Raise ValueError for an op not in OPS, or "avg" on a tensor that would truncate.

    Every all-reduce algorithm of the lesson checks its op with this before sending a message.
    """
    require_choice("op", op, OPS)
    if op == "avg" and not (tensor.is_floating_point() or tensor.is_complex()):
        raise ValueError(
            f"op='avg' on a {tensor.dtype} tensor would truncate: use op='sum' and divide, "
            "or pass a floating-point tensor"
        )


def peers_for(op: str, group, ledger: CommLedger | None, timeout_s: float) -> Peers:
    """Peers for one call of the primitive `op`, counting the call's traffic.

    `peers.counter.commit()` at the end of the call writes it into `ledger` as one entry.
    """
    return Peers(group, timeout_s, TrafficCounter(op, ledger))


@contextmanager
def contiguous_in_place(tensor: torch.Tensor) -> Iterator[torch.Tensor]:
    """`tensor` itself when contiguous; else a contiguous copy, written back into it at the end."""
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    yield work
    if work is not tensor:
        tensor.copy_(work)


def ring_chunk_indices(phase: str, rank: int, step: int, world_size: int) -> tuple[int, int]:
    """(chunk rank sends right, chunk it receives from the left) at step k = 1 .. N - 1 of `phase`.

    reduce_scatter: send (r - k) mod N, receive (r - k - 1) mod N: in step N - 1 a rank receives
    its own chunk. all_gather: send (r - k + 1) mod N, receive (r - k) mod N: each chunk travels
    N - 1 hops from its owner. The lesson's table and figures use this same function.
    Raises ValueError for an unknown phase or a step outside 1 .. N - 1.
    """
    if not 1 <= step < world_size:
        raise ValueError(f"step {step} is not a step of a ring of {world_size} ranks: "
                         f"use 1 <= step <= {world_size - 1}")
    if phase == "reduce_scatter":
        return (rank - step) % world_size, (rank - step - 1) % world_size
    if phase == "all_gather":
        return (rank - step + 1) % world_size, (rank - step) % world_size
    raise ValueError(f"unknown phase {phase!r}: use 'reduce_scatter' or 'all_gather'")


def _ring_reduce_scatter_into(peers: Peers, chunks: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Core of the ring reduce-scatter: return the sum over ranks of chunk `peers.rank`.

    Each step sends the partial sum received in the previous step (at first, the rank's own
    chunk) and adds this rank's copy of the chunk it receives. Two buffers serve all steps.
    """
    rank, world_size = peers.rank, peers.world_size
    if world_size == 1:
        return chunks[0].clone()
    longest = max(chunk.shape[0] for chunk in chunks)
    buffers = [chunks[0].new_empty((longest, *chunks[0].shape[1:])) for _ in range(2)]
    outgoing = chunks[ring_chunk_indices("reduce_scatter", rank, 1, world_size)[0]]
    for step in range(1, world_size):
        _, incoming_index = ring_chunk_indices("reduce_scatter", rank, step, world_size)
        incoming = buffers[step % 2][: chunks[incoming_index].shape[0]]
        peers.ring_step(outgoing, incoming, add_to_received=chunks[incoming_index])
        outgoing = incoming
    return outgoing


def _ring_all_gather_into(peers: Peers, chunks: tuple[torch.Tensor, ...]) -> None:
    """Core of the ring all-gather: chunk `peers.rank` is filled; fill every other chunk in place."""
    for step in range(1, peers.world_size):
        send_index, recv_index = ring_chunk_indices("all_gather", peers.rank, step,
                                                    peers.world_size)
        peers.ring_step(chunks[send_index], chunks[recv_index])


def ring_all_reduce(tensor: torch.Tensor, op: str = "sum", *, group=None,
                    ledger: CommLedger | None = None,
                    timeout_s: float = DEFAULT_WAIT_S) -> torch.Tensor:
    """Reduce `tensor` over all ranks in place (sum or average) with a ring; return it.

    Collective: call on every rank with tensors of the same shape and dtype.
    A reduce-scatter (N - 1 steps) followed by an all-gather (N - 1 steps) over the flattened
    tensor: each rank sends and receives 2(N-1)/N of the tensor's bytes, whatever N is.
    Raises ValueError for an unknown op, or op="avg" on an integer tensor.
    """
    check_op(op, tensor)
    peers = peers_for("all_reduce", group, ledger, timeout_s)
    with contiguous_in_place(tensor) as work:
        chunks = torch.tensor_split(work.view(-1), peers.world_size)
        own = _ring_reduce_scatter_into(peers, chunks)
        if op == "avg":
            own.div_(peers.world_size)
        chunks[peers.rank].copy_(own)
        _ring_all_gather_into(peers, chunks)
    peers.counter.commit()
    return tensor


def ring_reduce_scatter(tensor: torch.Tensor, op: str = "sum", *, group=None,
                        ledger: CommLedger | None = None,
                        timeout_s: float = DEFAULT_WAIT_S) -> torch.Tensor:
    """Return this rank's chunk of the reduction of `tensor` over all ranks; `tensor` is unchanged.

    Collective: call on every rank with tensors of the same shape and dtype.
    Shapes: rank r receives the reduced `torch.tensor_split(tensor, N)[r]` (split along dim 0), a
    new tensor. Each rank sends and receives (N-1)/N of the tensor's bytes.
    Raises ValueError for an unknown op, or op="avg" on an integer tensor.
    """
    check_op(op, tensor)
    peers = peers_for("reduce_scatter", group, ledger, timeout_s)
    chunks = torch.tensor_split(tensor.contiguous(), peers.world_size)
    own = _ring_reduce_scatter_into(peers, chunks)
    if op == "avg":
        own.div_(peers.world_size)
    peers.counter.commit()
    # `own` may be a view into a longer work buffer: copy it out so the buffer can be freed.
    return own.clone() if own.untyped_storage().nbytes() > own.numel() * own.element_size() else own


def ring_all_gather(shard: torch.Tensor, sizes: list[int] | None = None, *, group=None,
                    ledger: CommLedger | None = None,
                    timeout_s: float = DEFAULT_WAIT_S) -> torch.Tensor:
    """Return the concatenation (along dim 0) of every rank's `shard`, in rank order.

    Collective: call on every rank; shards may differ in length along dim 0 (as
    `torch.tensor_split` makes them) but must agree in dtype and in the other dims.
    `sizes[r]` is rank r's shard length; when None, the ranks first exchange their lengths
    (recorded in the ledger as "all_gather_sizes"). Each rank receives every other rank's shard
    once and sends N - 1 shards.
    Raises ValueError when `sizes` has the wrong length or disagrees with this rank's shard.
    """
    peers = peers_for("all_gather", group, ledger, timeout_s)
    output, chunks = gather_output(shard, sizes, peers, group, ledger, timeout_s)
    _ring_all_gather_into(peers, chunks)
    peers.counter.commit()
    return output


def gather_output(shard: torch.Tensor, sizes: list[int] | None, peers: Peers, group,
                  ledger: CommLedger | None, timeout_s: float):
    """(output, its chunks by rank) of an all-gather, with this rank's shard copied in place.

    What every all-gather algorithm does first: refuse a 0-dim shard, learn every rank's length
    (exchanged around the ring when `sizes` is None), check them, allocate the output.
    """
    if shard.dim() == 0:
        raise ValueError("shard must have at least one dimension; use shard.reshape(1)")
    if sizes is None:
        sizes = exchange_sizes(shard.shape[0], shard.device, group, ledger, timeout_s)
    sizes = check_sizes(sizes, peers, shard)
    output = shard.new_empty((sum(sizes), *shard.shape[1:]))
    chunks = torch.split(output, sizes)
    chunks[peers.rank].copy_(shard)
    return output, chunks


def check_sizes(sizes, peers: Peers, shard: torch.Tensor) -> list[int]:
    """`sizes` as ints; ValueError unless it has one length per rank and ours is `shard`'s."""
    sizes = [int(size) for size in sizes]
    if len(sizes) != peers.world_size or sizes[peers.rank] != shard.shape[0]:
        raise ValueError(
            f"sizes={sizes} does not describe this group: it needs {peers.world_size} lengths "
            f"and entry {peers.rank} must equal this rank's shard length {shard.shape[0]}"
        )
    return sizes


def exchange_sizes(length: int, device: torch.device, group, ledger: CommLedger | None,
                    timeout_s: float) -> list[int]:
    """Every rank's shard length, gathered with the same ring (one int64 per rank)."""
    peers = peers_for("all_gather_sizes", group, ledger, timeout_s)
    lengths = torch.zeros(peers.world_size, dtype=torch.int64, device=device)
    lengths[peers.rank] = length
    _ring_all_gather_into(peers, torch.tensor_split(lengths, peers.world_size))
    peers.counter.commit()
    return lengths.tolist()


def broadcast(tensor: torch.Tensor, src: int = 0, *, group=None,
              ledger: CommLedger | None = None,
              timeout_s: float = DEFAULT_WAIT_S) -> torch.Tensor:
    """Copy rank `src`'s `tensor` into `tensor` on every rank, in place, along a binomial tree.

    Collective: call on every rank with tensors of the same shape and dtype.
    With m = ceil(log2 N) and ranks counted from src: in the first round src sends to the rank
    2^(m-1) places further; in each following round every rank that holds the data sends it half
    as far as in the round before (when that rank exists), so all N ranks hold it after m rounds
    and N - 1 messages.
    Raises ValueError when `src` is not a rank of the group.
    """
    peers = peers_for("broadcast", group, ledger, timeout_s)
    world_size = peers.world_size
    if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < world_size:
        raise ValueError(f"src={src!r} is not a rank of this group: use 0 <= src < {world_size}")
    relative = (peers.rank - src) % world_size
    with contiguous_in_place(tensor) as work:
        mask = 1
        while mask < world_size:  # receive once, from the rank that clears our lowest set bit
            if relative & mask:
                peers.exchange(None, 0, work, (relative - mask + src) % world_size)
                break
            mask <<= 1
        mask >>= 1
        while mask > 0:  # then pass the data on to the ranks below our lowest set bit
            if relative + mask < world_size:
                peers.exchange(work, (relative + mask + src) % world_size, None, 0)
            mask >>= 1
    peers.counter.commit()
    return tensor


def naive_all_reduce(tensor: torch.Tensor, op: str = "sum", *, group=None,
                     ledger: CommLedger | None = None,
                     timeout_s: float = DEFAULT_WAIT_S) -> torch.Tensor:
    """All-reduce through rank 0: everyone sends its tensor to rank 0, which reduces and sends back.

    Collective: call on every rank with tensors of the same shape and dtype.
    Kept beside the ring for contrast: rank 0 receives and sends (N-1) x size bytes, so its link
    carries N/2 times what any link carries in a ring, and the cost grows with N.
    Raises ValueError for an unknown op, or op="avg" on an integer tensor.
    """
    check_op(op, tensor)
    peers = peers_for("naive_all_reduce", group, ledger, timeout_s)
    with contiguous_in_place(tensor) as work:
        if peers.rank == 0:
            incoming = work.new_empty(work.shape)
            for source in range(1, peers.world_size):
                peers.exchange(None, 0, incoming, source)
                work.add_(incoming)
            if op == "avg":
                work.div_(peers.world_size)
            for destination in range(1, peers.world_size):
                peers.exchange(work, destination, None, 0)
        else:
            peers.exchange(work, 0, None, 0)
            peers.exchange(None, 0, work, 0)
    peers.counter.commit()
    return tensor
