"""The alpha-beta cost model of collectives, and nccl-tests bandwidth figures (lesson 76).

A message of n bytes costs alpha + n * beta: alpha is the fixed latency of one message (software,
wake-ups, the network's one-way latency; under gloo, whose sender waits for the receiver's notice
that its receive is posted, a round trip), beta the time per byte (1 / bandwidth). A collective is a
sequence of such messages, so its time is (messages on the critical path) * alpha + (bytes on the
critical path) * beta. Arithmetic only (numpy for the fit), no torch and no ranks: lesson 76's
notebook fits it to the times `lesson_code.collectives_lab.time_primitives` measures. Try it from
a shell:

    python -c "from lesson_code.collectives import cost_model as c; print(c.predict('all_reduce', 2**26, 4, 1e-4, 1e-9))"

Formulas (N ranks, n bytes in the tensor):

| algorithm          | messages in sequence | bytes per rank in sequence |
|--------------------|----------------------|----------------------------|
| ring all-reduce    | 2(N-1)               | 2(N-1)/N * n               |
| ring reduce-scatter| N-1                  | (N-1)/N * n                |
| ring all-gather    | N-1                  | (N-1)/N * n                |
| tree broadcast     | ceil(log2 N)         | ceil(log2 N) * n           |
| naive all-reduce   | 2(N-1) (all at rank 0)| 2(N-1) * n                |
| recursive doubling | log2 p (+2)          | log2 p * n (+2n)           |
| halving-doubling   | 2 log2 p (+2)        | 2(p-1)/p * n (+2n)         |
| direct reduce-scatter, all-gather | N-1 (in one round) | (N-1)/N * n      |
| direct all-reduce  | 2(N-1) (two rounds)  | 2(N-1)/N * n               |
| naive reduce-scatter, all-gather | 2(N-1) (all at rank 0) | (N-1)(N+1)/N * n |
| shared-memory all-reduce | 4(N-1) (two barriers) | 3n copied in memory, none sent |

p is the largest power of two <= N; when N is not one (r = N - p > 0), the first 2r ranks fold
into pairs before the algorithm and unfold after it: one message of n bytes each way (the +2).
The direct algorithms post their N - 1 messages of a round at once; they are counted as N - 1
because one rank's link (or here, its CPU) still carries them one after another. The
shared-memory all-reduce sends no data: its messages are its two barriers, each a one-element naive
all-reduce through rank 0 (2(N-1) messages in a row), and its "bytes" the ones each rank copies (its
tensor in, its chunk of every slot, the result out), which cost time all the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lesson_code.harness.validate import require_choice, require_positive, require_positive_int

ALGORITHMS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "naive_all_reduce",
              "recursive_doubling", "halving_doubling", "direct_reduce_scatter",
              "direct_all_gather", "direct_all_reduce", "naive_reduce_scatter",
              "naive_all_gather", "shared_memory_all_reduce")

# nccl-tests (PERFORMANCE.md): bus bandwidth = algorithm bandwidth x this factor, so that busbw
# can be compared with the link's peak whatever N is.
_BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}


def _check(algorithm: str, world_size: int) -> None:
    """Raise ValueError for an algorithm not in ALGORITHMS or a world size below 1."""
    require_choice("algorithm", algorithm, ALGORITHMS)
    require_positive_int("world_size", world_size, "the number of ranks, such as 4")


def power_of_two_split(world_size: int) -> tuple[int, int]:
    """(p, r): the largest power of two p <= world_size, and r = world_size - p ranks that fold."""
    power = 1 << (world_size.bit_length() - 1)
    return power, world_size - power


def message_count(algorithm: str, world_size: int) -> int:
    """Messages on the critical path of `algorithm` over `world_size` ranks (the alpha term)."""
    _check(algorithm, world_size)
    steps = world_size - 1
    power, extra = power_of_two_split(world_size)
    rounds, fold = power.bit_length() - 1, (2 if extra else 0)
    return {
        "recursive_doubling": rounds + fold,
        "halving_doubling": 2 * rounds + fold,
        "all_reduce": 2 * steps,
        "reduce_scatter": steps,
        "all_gather": steps,
        "broadcast": math.ceil(math.log2(world_size)) if world_size > 1 else 0,
        "naive_all_reduce": 2 * steps,
        "direct_reduce_scatter": steps,
        "direct_all_gather": steps,
        "direct_all_reduce": 2 * steps,
        "naive_reduce_scatter": 2 * steps,
        "naive_all_gather": 2 * steps,
        # its two barriers, each a one-element naive all-reduce through rank 0
        "shared_memory_all_reduce": 2 * 2 * steps,
    }[algorithm]


def bytes_per_rank(algorithm: str, nbytes: float, world_size: int) -> float:
    """Bytes on the critical path per rank (the beta term) for a tensor of `nbytes` bytes.

    For the ring primitives this is also exactly what each rank sends when N divides the tensor;
    for the naive all-reduce it is what rank 0 receives and then sends.
    """
    _check(algorithm, world_size)
    n = world_size
    power, extra = power_of_two_split(world_size)
    fold = 2 * nbytes if extra else 0
    return {
        "recursive_doubling": (power.bit_length() - 1) * nbytes + fold,
        "halving_doubling": 2 * (power - 1) / power * nbytes + fold,
        "all_reduce": 2 * (n - 1) / n * nbytes,
        "reduce_scatter": (n - 1) / n * nbytes,
        "all_gather": (n - 1) / n * nbytes,
        "broadcast": message_count("broadcast", n) * nbytes,
        "naive_all_reduce": 2 * (n - 1) * nbytes,
        "direct_reduce_scatter": (n - 1) / n * nbytes,
        "direct_all_gather": (n - 1) / n * nbytes,
        "direct_all_reduce": 2 * (n - 1) / n * nbytes,
        # rank 0 receives N-1 tensors, sends N-1 chunks (all-gather: shards, then N-1 wholes)
        "naive_reduce_scatter": (n - 1) * (n + 1) / n * nbytes,
        "naive_all_gather": (n - 1) * (n + 1) / n * nbytes,
        # copied, not sent: the tensor in, this rank's chunk of all N slots, the result out
        "shared_memory_all_reduce": 3 * nbytes if n > 1 else 0,
    }[algorithm]


def predict(algorithm: str, nbytes: float, world_size: int, alpha: float, beta: float) -> float:
    """Predicted seconds: message_count * alpha + bytes_per_rank * beta."""
    return (message_count(algorithm, world_size) * alpha
            + bytes_per_rank(algorithm, nbytes, world_size) * beta)


@dataclass(frozen=True)
class AlphaBeta:
    """A fitted cost model: alpha in seconds per message, beta in seconds per byte."""

    alpha: float
    beta: float

    @property
    def bandwidth(self) -> float:
        """1 / beta, in bytes per second."""
        return math.inf if self.beta == 0 else 1.0 / self.beta


CLUSTER = AlphaBeta(alpha=5e-6, beta=1 / 25e9)
"""The cluster lesson 76 models (assumed, not measured): 5 us a message, 25 GB/s per link."""


def fit_alpha_beta(algorithm: str, world_size: int, sizes: list[float],
                   seconds: list[float], relative: bool = False) -> AlphaBeta:
    """Least-squares fit of alpha and beta to measured times of `algorithm` at several sizes.

    The model is linear in (alpha, beta): t = m * alpha + b(n) * beta, with m messages and b(n)
    bytes on the critical path, so `numpy.linalg.lstsq` solves it (columns scaled to 1 first, as
    b(n) is millions of times m). With `relative`, each row is divided by its measured time, so
    the fit minimises relative errors: times that span three decades then weigh alike, instead
    of the largest deciding alone. Raises ValueError with fewer than two distinct sizes, or with
    one rank, where nothing is sent and there is nothing to fit.
    """
    if len(sizes) != len(seconds) or len(set(sizes)) < 2:
        raise ValueError(f"need at least two distinct sizes with one time each, got {sizes}")
    if message_count(algorithm, world_size) == 0:
        raise ValueError(f"{algorithm} on world_size {world_size} sends no message, so there is "
                         "no alpha or beta to fit: measure on 2 or more ranks")
    design = np.array([[message_count(algorithm, world_size),
                        bytes_per_rank(algorithm, n, world_size)] for n in sizes], dtype=float)
    measured = np.asarray(seconds, dtype=float)
    if relative:
        design, measured = design / measured[:, None], np.ones_like(measured)
    scale = np.abs(design).max(axis=0)
    solution = np.linalg.lstsq(design / scale, measured, rcond=None)[0]
    alpha, beta = solution / scale
    return AlphaBeta(alpha=float(alpha), beta=float(beta))


def bandwidths(algorithm: str, nbytes: float, seconds: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in bytes per second, as nccl-tests defines them.

    algbw = nbytes / seconds; busbw = algbw x (2(N-1)/N for all-reduce, (N-1)/N for
    reduce-scatter and all-gather, 1 for broadcast), where nbytes is the full tensor's size.
    """
    require_choice("nccl-tests algorithm", algorithm, tuple(_BUS_FACTOR))
    require_positive("seconds", seconds, "the measured time of one call, above 0")
    algbw = nbytes / seconds
    return algbw, algbw * _BUS_FACTOR[algorithm](world_size)
