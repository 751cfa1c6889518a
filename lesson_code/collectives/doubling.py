"""All-reduce in few steps: recursive doubling and recursive halving-doubling (lesson 76).

A ring all-reduce takes 2(N-1) steps: for short messages, where each step costs mostly its
latency, that is many. These two take log2 N and 2 log2 N steps (the choice of MPICH and others):

- recursive doubling: in step k every rank swaps its whole tensor with the rank 2^k away (rank
  XOR 2^k) and adds. log2 N steps, but every step moves the whole tensor: n log2 N bytes per rank.
  Best for short messages.
- recursive halving-doubling (Rabenseifner): a reduce-scatter by recursive halving (in each step
  swap half of what is left with the partner, keep and add the other half), then an all-gather by
  recursive doubling (swap what you hold, so it doubles). 2 log2 N steps moving 2(N-1)/N x n bytes
  per rank, the ring's bytes. Best for long messages when steps cost more than bandwidth.

Both need a power of two. For another N, with p the largest power of two below it and r = N - p,
the first 2r ranks pair up: each even one of them sends its tensor to the odd one above it, which
adds it ("folds" it in) and takes part in the power-of-two algorithm among p ranks; at the end it
sends the result back. Results are identical on every rank (each sum is computed once, or by two
partners in commuting order, which IEEE addition gives bitwise the same).

    from lesson_code.collectives import doubling
    doubling.recursive_doubling_all_reduce(tensor, "sum")    # call on every rank
"""

from __future__ import annotations

import torch

from lesson_code.collectives.ledger import CommLedger
from lesson_code.collectives.p2p import DEFAULT_WAIT_S, Peers
from lesson_code.collectives.ring import check_op, contiguous_in_place, peers_for


class PowerOfTwoGroup:
    """The ranks that take part after the fold, numbered 0..p-1, and how to reach them.

    `new_rank` is None for a rank that folded its data into a partner and waits for the result.
    """

    def __init__(self, peers: Peers):
        self.peers = peers
        self.size = 1 << (peers.world_size.bit_length() - 1)  # largest power of two <= N
        self.extra = peers.world_size - self.size             # r: ranks that fold
        rank = peers.rank
        if rank < 2 * self.extra:
            self.new_rank = rank // 2 if rank % 2 else None
        else:
            self.new_rank = rank - self.extra

    def real_rank(self, new_rank: int) -> int:
        """Group rank of the participant numbered `new_rank`."""
        return 2 * new_rank + 1 if new_rank < self.extra else new_rank + self.extra

    def fold(self, work: torch.Tensor) -> None:
        """The first 2r ranks: even ones send, odd ones receive and add."""
        rank = self.peers.rank
        if rank >= 2 * self.extra:
            return
        if rank % 2 == 0:
            self.peers.exchange(work, rank + 1, None, 0)
        else:
            incoming = torch.empty_like(work)
            self.peers.exchange(None, 0, incoming, rank - 1)
            work.add_(incoming)

    def unfold(self, work: torch.Tensor) -> None:
        """Give the folded ranks the result: odd ones send it back to the even one below."""
        rank = self.peers.rank
        if rank >= 2 * self.extra:
            return
        if rank % 2:
            self.peers.exchange(work, rank - 1, None, 0)
        else:
            self.peers.exchange(None, 0, work, rank + 1)


def recursive_doubling_all_reduce(tensor: torch.Tensor, op: str = "sum", *, group=None,
                                  ledger: CommLedger | None = None,
                                  timeout_s: float = DEFAULT_WAIT_S) -> torch.Tensor:
    """Reduce `tensor` over all ranks in place by recursive doubling; return it.

    Collective: call on every rank with tensors of the same shape and dtype. log2 p steps, p the
    largest power of two <= N (plus two for a world size that is not a power of two), each
    moving the whole tensor.
    Raises ValueError for an unknown op, or op="avg" on an integer tensor.
    """
    return _folded_all_reduce(tensor, op, group, ledger, timeout_s, _doubling_core)


def _doubling_core(powers: PowerOfTwoGroup, flat: torch.Tensor) -> None:
    """Among the p participants: swap the whole vector with rank XOR 2^k and add, k = 0, 1, ..."""
    incoming = torch.empty_like(flat)
    mask = 1
    while mask < powers.size:
        partner = powers.real_rank(powers.new_rank ^ mask)
        powers.peers.exchange(flat, partner, incoming, partner)
        flat.add_(incoming)
        mask <<= 1


def halving_doubling_all_reduce(tensor: torch.Tensor, op: str = "sum", *, group=None,
                                ledger: CommLedger | None = None,
                                timeout_s: float = DEFAULT_WAIT_S) -> torch.Tensor:
    """Reduce `tensor` over all ranks in place by recursive halving then doubling; return it.

    Collective: call on every rank with tensors of the same shape and dtype. The flattened tensor
    is cut into p chunks (`torch.tensor_split`); after the halving, participant i holds the sum of
    chunk i, which the doubling then spreads. Raises ValueError as `recursive_doubling_all_reduce`.
    """
    return _folded_all_reduce(tensor, op, group, ledger, timeout_s, _halving_doubling_core)


def _halving_doubling_core(powers: PowerOfTwoGroup, flat: torch.Tensor) -> None:
    """Among the p participants: reduce-scatter by halving, then all-gather by doubling."""
    bounds = chunk_bounds(torch.tensor_split(flat, powers.size))
    low, high = reduce_scatter_by_halving(powers, flat, bounds)
    all_gather_by_doubling(powers, flat, bounds, low, high)


def _folded_all_reduce(tensor: torch.Tensor, op: str, group, ledger: CommLedger | None,
                       timeout_s: float, core) -> torch.Tensor:
    """Fold the extra ranks in, run `core(powers, flat)` among p ranks, scale, unfold; return it.

    Dividing before the unfold, on the participants, gives every rank the same bits for "avg".
    """
    check_op(op, tensor)
    peers = peers_for("all_reduce", group, ledger, timeout_s)
    with contiguous_in_place(tensor) as work:
        flat = work.view(-1)
        powers = PowerOfTwoGroup(peers)
        powers.fold(flat)
        if powers.new_rank is not None:
            core(powers, flat)
            if op == "avg":
                flat.div_(peers.world_size)
        powers.unfold(flat)
    peers.counter.commit()
    return tensor


def chunk_bounds(chunks: tuple[torch.Tensor, ...]) -> list[int]:
    """Offsets of the chunks in the flat tensor: chunk i is [bounds[i], bounds[i + 1])."""
    bounds = [0]
    for chunk in chunks:
        bounds.append(bounds[-1] + chunk.numel())
    return bounds


def reduce_scatter_by_halving(powers: PowerOfTwoGroup, flat: torch.Tensor,
                               bounds: list[int]) -> tuple[int, int]:
    """Halve the window of chunks each step; return the [low, high) chunks held at the end (one)."""
    low, high, mask = 0, powers.size, powers.size >> 1
    # The first step keeps the larger half at most; later steps keep less (never the whole).
    half = bounds[powers.size // 2]
    incoming = flat.new_empty(max(half, flat.numel() - half))
    while mask:
        middle = (low + high) // 2
        keep_low = not powers.new_rank & mask
        keep = (low, middle) if keep_low else (middle, high)
        give = (middle, high) if keep_low else (low, middle)
        kept = flat[bounds[keep[0]]: bounds[keep[1]]]
        received = incoming[: kept.numel()]
        partner = powers.real_rank(powers.new_rank ^ mask)
        powers.peers.exchange(flat[bounds[give[0]]: bounds[give[1]]], partner, received, partner)
        kept.add_(received)
        low, high = keep
        mask >>= 1
    return low, high


def all_gather_by_doubling(powers: PowerOfTwoGroup, flat: torch.Tensor, bounds: list[int],
                            low: int, high: int) -> None:
    """Swap the held window with the partner's each step, so the window doubles to everything."""
    mask = 1
    while mask < powers.size:
        width = high - low
        partner_low = low + width if not powers.new_rank & mask else low - width
        partner = powers.real_rank(powers.new_rank ^ mask)
        powers.peers.exchange(flat[bounds[low]: bounds[high]], partner,
                              flat[bounds[partner_low]: bounds[partner_low + width]], partner)
        low, high = min(low, partner_low), max(high, partner_low + width)
        mask <<= 1
