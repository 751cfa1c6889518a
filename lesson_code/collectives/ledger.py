"""A communication ledger: the bytes one rank sends and receives, per collective call (lesson 76).

Every primitive in `lesson_code.collectives` takes an optional `CommLedger` and records, for the
calling rank, how many bytes it put on the wire and took off it. Lessons 77-81 pass the same ledger
through DDP and ZeRO, so a table can show, from counted bytes rather than from a formula, that a
reduce-scatter plus an all-gather moves exactly what one all-reduce moves: 2(N-1)/N x size per rank.

    ledger = CommLedger()
    ring_all_reduce(tensor, ledger=ledger)      # inside a rank
    ledger.totals()                              # {"all_reduce": {"calls": 1, "bytes_sent": ...}}

No torch.distributed here: a ledger is plain bookkeeping, filled in by the code that communicates
(`lesson_code.collectives.p2p`). `collectives_lab.measure_ledgers` fills one per rank for the
lesson's tables; `python -m lesson_code.collectives_lab` runs the primitives on 4 ranks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class LedgerEntry:
    """One collective call as seen by one rank: what it sent and received, in bytes and messages."""

    op: str
    bytes_sent: int
    bytes_received: int
    messages_sent: int
    messages_received: int


@dataclass
class CommLedger:
    """Per-rank record of point-to-point traffic, one entry per collective call.

    Not shared between ranks: each rank fills its own, and a lesson gathers them (results of
    `launch.spawn`) to compare ranks.
    """

    entries: list[LedgerEntry] = field(default_factory=list)

    def record(self, op: str, bytes_sent: int, bytes_received: int,
               messages_sent: int, messages_received: int) -> None:
        """Append one call's traffic. Raises ValueError on negative counts (a bookkeeping bug)."""
        counts = (bytes_sent, bytes_received, messages_sent, messages_received)
        if min(counts) < 0:
            raise ValueError(f"ledger counts must be non-negative, got {counts} for {op!r}")
        self.entries.append(LedgerEntry(op, *counts))

    @property
    def bytes_sent(self) -> int:
        """Bytes this rank sent over all recorded calls."""
        return sum(entry.bytes_sent for entry in self.entries)

    @property
    def bytes_received(self) -> int:
        """Bytes this rank received over all recorded calls."""
        return sum(entry.bytes_received for entry in self.entries)

    def totals(self) -> dict[str, dict[str, int]]:
        """Traffic summed per operation name: {op: {calls, bytes_sent, bytes_received, ...}}."""
        summary: dict[str, dict[str, int]] = {}
        for entry in self.entries:
            row = summary.setdefault(entry.op, {"calls": 0, "bytes_sent": 0, "bytes_received": 0,
                                                "messages_sent": 0, "messages_received": 0})
            row["calls"] += 1
            for key, value in asdict(entry).items():
                if key != "op":
                    row[key] += value
        return summary

    def clear(self) -> None:
        """Forget every entry (for example after warm-up steps)."""
        self.entries.clear()


class TrafficCounter:
    """Accumulates one call's traffic while a primitive runs, then writes a single ledger entry."""

    def __init__(self, op: str, ledger: CommLedger | None):
        self.op, self.ledger = op, ledger
        self.bytes_sent = self.bytes_received = 0
        self.messages_sent = self.messages_received = 0

    def sent(self, nbytes: int) -> None:
        """Count one message of `nbytes` bytes sent."""
        self.bytes_sent += nbytes
        self.messages_sent += 1

    def received(self, nbytes: int) -> None:
        """Count one message of `nbytes` bytes received."""
        self.bytes_received += nbytes
        self.messages_received += 1

    def commit(self) -> None:
        """Write the entry (no-op without a ledger)."""
        if self.ledger is not None:
            self.ledger.record(self.op, self.bytes_sent, self.bytes_received,
                               self.messages_sent, self.messages_received)
