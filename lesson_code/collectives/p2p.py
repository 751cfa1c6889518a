"""Point-to-point messages between ranks: the only communication lesson 76's collectives use.

`Peers` knows this rank's place in a process group and exchanges tensors with other ranks through
`isend`/`irecv`, waiting on each with a bound (never forever) and counting the bytes in a ledger.
`ring_step` is one step of a ring: send to the right neighbour, receive from the left.

Used inside ranks started by `lesson_code.launch`; `lesson_code.collectives.ring` builds the
algorithms on it, and `python -m lesson_code.collectives_lab` checks them on 4 ranks.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from lesson_code.collectives.ledger import TrafficCounter

DEFAULT_WAIT_S = 120.0
# A ring step splits a chunk into pieces of at least PIECE_BYTES (at most MAX_PIECES of them).
PIECE_BYTES = 1024 * 1024
MAX_PIECES = 4


def _piece_count(chunk: torch.Tensor) -> int:
    """How many pieces a ring step cuts `chunk` into: 1 for small chunks, up to MAX_PIECES."""
    nbytes = chunk.numel() * chunk.element_size()
    return max(1, min(MAX_PIECES, nbytes // PIECE_BYTES, chunk.shape[0] if chunk.dim() else 1))


class Peers:
    """This rank's place in a group (rank, world size, neighbours) and bounded message exchange.

    Raises RuntimeError when no process group is initialised, with the way to start one.
    """

    def __init__(self, group, timeout_s: float, counter: TrafficCounter):
        if not dist.is_initialized():
            raise RuntimeError(
                "no process group: run this inside launch.spawn(...) or under torchrun "
                "(collectives are called on every rank of an initialised group)"
            )
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.timeout = timedelta(seconds=timeout_s)
        self.counter = counter
        # Under NCCL a send may wait on the GPU until its receive is posted: each step's messages
        # are posted there as one group (batch_isend_irecv), in which the order of sends and
        # receives cannot deadlock. gloo runs them one by one (its batches can hang).
        self.batched = dist.get_backend(group) == "nccl"

    def global_rank(self, group_rank: int) -> int:
        """The rank in the default group of rank `group_rank` of this group."""
        if self.group is None:
            return group_rank
        return dist.get_global_rank(self.group, group_rank)

    def exchange(self, send: torch.Tensor | None, to: int,
                 recv: torch.Tensor | None, source: int) -> None:
        """Send `send` to group rank `to` while receiving `recv` from `source`; wait for both.

        Empty tensors are skipped on both sides (both sides derive the same sizes, so they agree).
        """
        if self.batched:
            self._post_together([(recv, source)], [(send, to)])
            return
        self._wait_all([self._post(dist.irecv, recv, source), self._post(dist.isend, send, to)])

    def ring_step(self, send: torch.Tensor, recv: torch.Tensor,
                  add_to_received: torch.Tensor | None = None) -> None:
        """One ring step: send `send` right, receive `recv` from the left, optionally add a chunk.

        Large chunks travel as a few pieces posted at once, so that adding piece j of the
        received chunk overlaps with pieces j+1, ... still arriving.
        """
        # Sender and receiver split the same chunk, so they agree on the pieces.
        sends = torch.tensor_split(send, _piece_count(send))
        recvs = torch.tensor_split(recv, _piece_count(recv))
        adds = torch.tensor_split(add_to_received, len(recvs)) if add_to_received is not None else None
        if self.batched:
            self._post_together([(piece, self.left) for piece in recvs],
                                [(piece, self.right) for piece in sends])
            if add_to_received is not None:
                recv.add_(add_to_received)
            return
        # Receives first, so that the buffer for the left neighbour's data is posted before our
        # sends start. The order cannot deadlock: both calls return at once, the waits come after.
        receiving = [self._post(dist.irecv, piece, self.left) for piece in recvs]
        sending = [self._post(dist.isend, piece, self.right) for piece in sends]
        for index, work in enumerate(receiving):
            self._wait_all([work])
            if adds is not None:
                recvs[index].add_(adds[index])
        self._wait_all(sending)

    def post_recv(self, tensor: torch.Tensor, source: int):
        """Start receiving `tensor` from group rank `source`; a handle for `wait_all` (or None)."""
        return self._post(dist.irecv, tensor, source)

    def post_send(self, tensor: torch.Tensor, dest: int):
        """Start sending `tensor` to group rank `dest`; a handle for `wait_all` (or None)."""
        return self._post(dist.isend, tensor, dest)

    def wait_all(self, works: list) -> None:
        """Wait for each started message (None: nothing was posted), each wait bounded."""
        self._wait_all(works)

    def post_together(self, recvs: list, sends: list) -> None:
        """Post (tensor, group rank) receives and sends, then wait for all, each wait bounded.

        Under NCCL they go as one group (batch_isend_irecv), as every `exchange` and ring step
        does: NCCL carries batched and single messages on different communicators, so a message
        posted singly on one end and batched on the other never matches. Under gloo they are
        posted one by one, receives first.
        """
        if self.batched:
            self._post_together(recvs, sends)
            return
        works = [self._post(dist.irecv, tensor, source) for tensor, source in recvs]
        self._wait_all(works + [self._post(dist.isend, tensor, dest) for tensor, dest in sends])

    def _post_together(self, recvs: list, sends: list) -> None:
        """Post (tensor, group rank) receives and sends as one NCCL group; wait for all, bounded."""
        ops = []
        for post, pairs in ((dist.irecv, recvs), (dist.isend, sends)):
            for tensor, peer in pairs:
                if self._count(post, tensor):
                    ops.append(dist.P2POp(post, tensor, self.global_rank(peer), self.group))
        self._wait_all(dist.batch_isend_irecv(ops) if ops else [])

    def _count(self, post, tensor: torch.Tensor | None) -> bool:
        """Count `tensor` as sent (post is dist.isend) or received; False when there is nothing."""
        if tensor is None or tensor.numel() == 0:
            return False
        nbytes = tensor.numel() * tensor.element_size()
        (self.counter.sent if post is dist.isend else self.counter.received)(nbytes)
        return True

    def _post(self, post, tensor: torch.Tensor | None, peer: int):
        """Start `post` (dist.isend or dist.irecv) of `tensor` with group rank `peer`, or None."""
        if not self._count(post, tensor):
            return None
        return post(tensor, self.global_rank(peer), group=self.group)

    def _wait_all(self, works: list) -> None:
        """Wait for each started message (None: nothing was posted), each wait bounded.

        Raises TimeoutError (from the backend's error) when a message does not complete in time:
        under torchrun no launcher watches the ranks, so this rank's error is the only report.
        """
        for work in works:
            if work is None:
                continue
            try:
                work.wait(self.timeout)
            except RuntimeError as error:
                if "timed out" not in str(error).lower():
                    raise
                raise TimeoutError(
                    f"rank {self.rank} of {self.world_size} waited {self.timeout.total_seconds():g} "
                    f"s in {self.counter.op} for a message that did not come: the other ranks "
                    "are in another collective, or in this one with another algorithm (every "
                    "rank must call the same collectives, with the same algorithm, in the same "
                    "order), or much slower (pass a larger timeout_s). The traceback names this "
                    "rank's algorithm.") from error

    @property
    def right(self) -> int:
        """The group rank this rank sends to in a ring step."""
        return (self.rank + 1) % self.world_size

    @property
    def left(self) -> int:
        """The group rank this rank receives from in a ring step."""
        return (self.rank - 1) % self.world_size
