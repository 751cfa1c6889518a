"""Page 76b's code (collectives in production): a broadcast along a chain that forwards each piece
as soon as it arrives, and an all-to-all from pairwise messages, each with a rank function that
checks it against torch.distributed bit for bit.

Lesson 76's own rank functions are `lesson_code.collectives_lab`; page 76b's cells run these
through the launcher, as the lesson does:

    from lesson_code import launch, collectives_exercises
    launch.spawn(collectives_exercises.compare_chain_broadcast, 2, 1001, 4, world_size=5)
    launch.spawn(collectives_exercises.compare_all_to_all, 4000, world_size=4)
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from lesson_code.collectives.ledger import CommLedger
from lesson_code.collectives.p2p import DEFAULT_WAIT_S
from lesson_code.collectives.ring import contiguous_in_place, peers_for
from lesson_code.collectives_lab import builtin_broadcast, make_input


def chain_broadcast(tensor: torch.Tensor, src: int = 0, pieces: int = 4, *, group=None,
                    ledger: CommLedger | None = None,
                    timeout_s: float = DEFAULT_WAIT_S) -> torch.Tensor:
    """Copy rank `src`'s `tensor` into `tensor` on every rank, in place, along a pipelined chain.

    Collective: call on every rank with tensors of the same shape and dtype. Counted from `src`,
    the ranks form a chain 0 -> 1 -> ... -> N-1; the flattened tensor is cut into `pieces`
    (`torch.tensor_split`), every receive is posted at once, and each rank forwards piece p as
    soon as it has arrived, while pieces p+1, ... are still on their way. So each piece travels
    N - 1 hops, (N - 1) x pieces messages in all, and no rank sends the tensor more than once.
    Raises ValueError when `src` is not a rank of the group or `pieces` is below 1.
    """
    peers = peers_for("chain_broadcast", group, ledger, timeout_s)
    world_size = peers.world_size
    if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < world_size:
        raise ValueError(f"src={src!r} is not a rank of this group: use 0 <= src < {world_size}")
    if isinstance(pieces, bool) or not isinstance(pieces, int) or pieces < 1:
        raise ValueError(f"pieces={pieces!r}: cut the tensor into 1 or more pieces")
    position = (peers.rank - src) % world_size  # place in the chain
    before, after = (peers.rank - 1) % world_size, (peers.rank + 1) % world_size
    with contiguous_in_place(tensor) as work:
        parts = torch.tensor_split(work.view(-1), pieces)
        arriving = [peers.post_recv(part, before) if position > 0 else None for part in parts]
        forwarding = []
        for part, arrival in zip(parts, arriving):
            peers.wait_all([arrival])
            if position < world_size - 1:
                forwarding.append(peers.post_send(part, after))
        peers.wait_all(forwarding)
    peers.counter.commit()
    return tensor


def compare_chain_broadcast(rank: int, world_size: int, src: int, numel: int,
                            pieces: int) -> dict:
    """The chain broadcast of `numel` float32 values from `src`, beside dist.broadcast.

    Collective: call on every rank. Returns this rank's ledger of the chain broadcast (bytes and
    messages sent and received) and `equal`: whether its result has the same bits as the built-in's.
    """
    x = make_input(rank, numel, "float32")
    ledger = CommLedger()
    ours = chain_broadcast(x.clone(), src, pieces, ledger=ledger)
    return {"equal": torch.equal(ours, builtin_broadcast(x, src)),
            **ledger.totals()["chain_broadcast"]}


def pairwise_all_to_all(tensor: torch.Tensor, *, group=None, ledger: CommLedger | None = None,
                        timeout_s: float = DEFAULT_WAIT_S) -> torch.Tensor:
    """`dist.all_to_all_single` from messages, pairwise; returns a new tensor.

    Collective: call on every rank with tensors of the same shape and dtype. Cut along its first
    dimension into N chunks, chunk j of this rank's `tensor` goes to rank j, and the result holds
    chunk r (r this rank) of every rank, in rank order. In round k = 1, ..., N-1 rank r sends to
    rank r + k and receives from rank r - k (mod N): every round is one permutation of the ranks,
    N - 1 messages of n/N bytes each way in all; a rank's own chunk is copied, not sent.
    Raises ValueError when the first dimension is not a multiple of the group's size.
    """
    peers = peers_for("pairwise_all_to_all", group, ledger, timeout_s)
    world_size, rank = peers.world_size, peers.rank
    if tensor.dim() == 0 or tensor.shape[0] % world_size:
        raise ValueError(f"a tensor of shape {tuple(tensor.shape)} cannot be cut into "
                         f"{world_size} equal chunks along its first dimension: pad it to a "
                         f"multiple of {world_size}")
    sending = tensor.contiguous().chunk(world_size)
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    receiving = output.chunk(world_size)
    receiving[rank].copy_(sending[rank])
    for k in range(1, world_size):
        to, source = (rank + k) % world_size, (rank - k) % world_size
        peers.exchange(sending[to], to, receiving[source], source)
    peers.counter.commit()
    return output


def compare_all_to_all(rank: int, world_size: int, rows: int, dtype_name: str = "float32") -> dict:
    """The pairwise all-to-all of a (rows, 3) tensor, beside dist.all_to_all_single.

    Collective: call on every rank. Returns this rank's ledger of the pairwise all-to-all and
    `equal`: whether its result has the same bits as the built-in's.
    """
    x = make_input(rank, rows * 3, dtype_name).view(rows, 3)
    ledger = CommLedger()
    ours = pairwise_all_to_all(x, ledger=ledger)
    builtin = torch.empty_like(x)
    dist.all_to_all_single(builtin, x)
    return {"equal": torch.equal(ours, builtin), **ledger.totals()["pairwise_all_to_all"]}
