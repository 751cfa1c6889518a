"""Reduce-scatter and all-gather through rank 0: the naive algorithms, for short messages (lesson 76).

The naive all-reduce of `ring` (everyone sends to rank 0, which reduces and sends back) has the
same two cousins: a reduce-scatter where rank 0 reduces the whole tensor and hands each rank its
chunk, and an all-gather where rank 0 collects every shard and hands everyone the whole. Rank 0
carries about N times the bytes of a ring rank, so they lose on long messages; but every other
rank sends once and receives once, one wake-up each, and on CPUs whose ranks share cores those
wake-ups, not the bytes, are what short messages cost (lesson 76 measures it: the naive
all-reduce is the fastest of all below a megabyte there).

Chunking follows `torch.tensor_split(tensor, N)` along dim 0, as in `ring`.

    from lesson_code.collectives import naive
    naive.naive_reduce_scatter(tensor, "sum")        # call on every rank
    naive.naive_all_gather(shard, sizes)
"""

from __future__ import annotations

import torch

from lesson_code.collectives.ledger import CommLedger
from lesson_code.collectives.p2p import DEFAULT_WAIT_S
from lesson_code.collectives.ring import check_op, gather_output, peers_for


def naive_reduce_scatter(tensor: torch.Tensor, op: str = "sum", *, group=None,
                         ledger: CommLedger | None = None,
                         timeout_s: float = DEFAULT_WAIT_S) -> torch.Tensor:
    """Return this rank's chunk of the reduction of `tensor`, reduced on rank 0; `tensor` unchanged.

    Collective: call on every rank with tensors of the same shape and dtype. Rank r gets the
    reduced `torch.tensor_split(tensor, N)[r]` (dim 0), a new tensor. Rank 0 receives N - 1
    tensors and sends N - 1 chunks; every other rank sends its tensor and receives its chunk.
    Raises ValueError for an unknown op, or op="avg" on an integer tensor.
    """
    check_op(op, tensor)
    peers = peers_for("reduce_scatter", group, ledger, timeout_s)
    work, world_size = tensor.contiguous(), peers.world_size
    if peers.rank == 0:
        total, incoming = work.clone(), torch.empty_like(work)
        for source in range(1, world_size):  # one buffer, added in rank order
            peers.exchange(None, 0, incoming, source)
            total.add_(incoming)
        chunks = torch.tensor_split(total, world_size)
        peers.post_together([], [(chunks[dest], dest) for dest in range(1, world_size)])
        own = chunks[0].clone()
    else:
        own = torch.tensor_split(work, world_size)[peers.rank].clone()
        peers.exchange(work, 0, own, 0)
    if op == "avg":
        own.div_(world_size)
    peers.counter.commit()
    return own


def naive_all_gather(shard: torch.Tensor, sizes: list[int] | None = None, *, group=None,
                     ledger: CommLedger | None = None,
                     timeout_s: float = DEFAULT_WAIT_S) -> torch.Tensor:
    """Return every rank's `shard` concatenated along dim 0 in rank order, gathered on rank 0.

    Collective: call on every rank; arguments and errors as `ring_all_gather` (shards may differ
    in length along dim 0; `sizes[r]` is rank r's length, exchanged first when None). Rank 0
    receives N - 1 shards and sends the whole to N - 1 ranks; the others send and receive once.
    """
    peers = peers_for("all_gather", group, ledger, timeout_s)
    output, chunks = gather_output(shard, sizes, peers, group, ledger, timeout_s)
    if peers.rank == 0:
        others = range(1, peers.world_size)
        peers.post_together([(chunks[source], source) for source in others], [])
        peers.post_together([], [(output, dest) for dest in others])
    else:
        peers.exchange(shard.contiguous(), 0, output, 0)  # the whole comes back into output
    peers.counter.commit()
    return output
