"""Collectives that choose their algorithm by message size and world size (lesson 76).

Short messages cost mostly latency (alpha per step), long ones bandwidth (beta per byte), so no
one algorithm wins everywhere: recursive doubling takes the fewest steps, the ring and
halving-doubling move the fewest bytes, the direct algorithms send them in one round, and ranks
on one machine can skip sending altogether through shared memory (`shared_memory`).
`all_reduce(..., algorithm="auto")` expects each algorithm's time from times measured on this
kind of machine (read between the measured sizes, and beyond them from the alpha-beta model of
`cost_model` fitted to them), and runs the fastest; `reduce_scatter` and `all_gather` choose
between the ring, the direct and the naive (through rank 0) algorithm the same way, each from
its own stored times. NCCL
and MPICH choose the same way, from tables tuned per machine.

The constants come from `AlgorithmCosts`: `stored_costs()` (the times `make bench` stored with
the package, with the machine and date they were measured on) or `calibrate()` (a quick
measurement on the ranks themselves, a few seconds, agreed across ranks). Every rank must choose
the same algorithm, or they would wait for each other's messages forever: both sources give
every rank the same constants.

    from lesson_code.collectives import all_reduce
    all_reduce(tensor, "sum")                          # call on every rank; in place
    all_reduce(tensor, "sum", algorithm="recursive_doubling")
    reduce_scatter(tensor, "sum"); all_gather(shard, sizes)   # chosen alike
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from functools import lru_cache, partial
from pathlib import Path

import torch
import torch.distributed as dist

from lesson_code.collectives import cost_model, direct, doubling, naive, ring, shared_memory
from lesson_code.collectives.ledger import CommLedger
from lesson_code.collectives.p2p import DEFAULT_WAIT_S
from lesson_code.devices import current_device
from lesson_code.timing import collective_seconds
from lesson_code.validate import require_choice

ALL_REDUCE = {
    "ring": ring.ring_all_reduce,
    "recursive_doubling": doubling.recursive_doubling_all_reduce,
    "halving_doubling": doubling.halving_doubling_all_reduce,
    "naive": ring.naive_all_reduce,
    "direct": direct.direct_all_reduce,
    "shared_memory": shared_memory.shared_memory_all_reduce,
}
CHOICES = ("auto", *ALL_REDUCE)
MODEL_NAME = {"ring": "all_reduce", "recursive_doubling": "recursive_doubling",
              "halving_doubling": "halving_doubling", "naive": "naive_all_reduce",
              "direct": "direct_all_reduce", "shared_memory": "shared_memory_all_reduce"}
REDUCE_SCATTER = {"ring": ring.ring_reduce_scatter, "direct": direct.direct_reduce_scatter,
                  "naive": naive.naive_reduce_scatter}
ALL_GATHER = {"ring": ring.ring_all_gather, "direct": direct.direct_all_gather,
              "naive": naive.naive_all_gather}
# Per collective: its algorithms, each one's name in `cost_model`, and the file of its times.
ALGORITHMS = {"all_reduce": ALL_REDUCE, "reduce_scatter": REDUCE_SCATTER,
              "all_gather": ALL_GATHER}
MODEL_NAMES = {"all_reduce": MODEL_NAME,
               "reduce_scatter": {"ring": "reduce_scatter", "direct": "direct_reduce_scatter",
                                  "naive": "naive_reduce_scatter"},
               "all_gather": {"ring": "all_gather", "direct": "direct_all_gather",
                              "naive": "naive_all_gather"}}
STORED = Path(__file__).with_name("measured_all_reduce.csv")
STORED_FILES = {"all_reduce": STORED,
                "reduce_scatter": STORED.with_name("measured_reduce_scatter.csv"),
                "all_gather": STORED.with_name("measured_all_gather.csv")}
CALIBRATION_SIZES = (2 ** 10, 2 ** 14, 2 ** 18, 2 ** 22)


@dataclass(frozen=True)
class AlgorithmCosts:
    """Fitted alpha and beta of each algorithm of one collective, the measured times they were
    fitted to ({algorithm: (world size, ((nbytes, seconds), ...) by size)}), and their source.

    `nbytes` below is always the full tensor's size (for an all-gather: the gathered output).
    """

    fits: dict[str, cost_model.AlphaBeta]
    source: str
    collective: str = "all_reduce"
    measured: dict[str, tuple[int, tuple[tuple[int, float], ...]]] = field(default_factory=dict)

    def predict(self, algorithm: str, nbytes: int, world_size: int) -> float:
        """Predicted seconds of `algorithm` on a tensor of `nbytes` bytes over `world_size`."""
        fit = self.fits[algorithm]
        return cost_model.predict(MODEL_NAMES[self.collective][algorithm], nbytes, world_size,
                                  fit.alpha, fit.beta)

    def expected(self, algorithm: str, nbytes: int, world_size: int) -> float:
        """Seconds `choose` expects: the measured times where they reach, the model beyond them.

        Between two measured sizes (on the world size measured) the time is read off the
        straight line joining them on log-log axes, the way NCCL and MPICH read their tuned
        tables: two constants cannot follow every step a real machine shows (here the fit
        misses single sizes by up to 40%, enough to rank two algorithms the wrong way).
        """
        ranks, points = self.measured.get(algorithm, (0, ()))
        if ranks != world_size or not points or not points[0][0] <= nbytes <= points[-1][0]:
            return self.predict(algorithm, nbytes, world_size)
        for (n0, t0), (n1, t1) in zip(points, points[1:]):
            if n0 <= nbytes <= n1:
                weight = math.log(nbytes / n0) / math.log(n1 / n0)
                return t0 * (t1 / t0) ** weight
        return points[0][1]  # one measured size, and nbytes is it

    def choose(self, nbytes: int, world_size: int) -> str:
        """The algorithm with the smallest expected time (the first listed on a tie)."""
        return min(self.fits, key=lambda name: self.expected(name, nbytes, world_size))

    @classmethod
    def from_times(cls, rows: list[dict], source: str,
                   collective: str = "all_reduce") -> "AlgorithmCosts":
        """Fit each algorithm of `collective` to rows {algorithm, world_size, nbytes, seconds}.

        The fit weighs each time by its inverse (relative error), so 1 KiB and 64 MiB count
        alike although their times differ a thousandfold.
        """
        require_choice("collective", collective, tuple(ALGORITHMS))
        fits, measured = {}, {}
        for name, model in MODEL_NAMES[collective].items():
            mine = [row for row in rows if row["algorithm"] == name]
            if len(mine) >= 2:
                world_size = int(mine[0]["world_size"])
                fits[name] = cost_model.fit_alpha_beta(
                    model, world_size,
                    [float(row["nbytes"]) for row in mine], [float(row["seconds"]) for row in mine],
                    relative=True)
                measured[name] = (world_size, tuple(sorted(
                    (int(row["nbytes"]), float(row["seconds"])) for row in mine
                    if int(row["world_size"]) == world_size)))
        if not fits:
            raise ValueError(f"no {collective} algorithm has times at two sizes in {source}: "
                             "measure again (python -m lesson_code.bench collectives)")
        return cls(fits=fits, source=source, collective=collective, measured=measured)


def fastest_measured(rows: list[dict]) -> dict[int, str]:
    """For each measured size, the all-reduce algorithm of ALL_REDUCE with the shortest time.

    `rows` as `stored_times` reads them; rows of "auto" and "gloo" are not candidates.
    """
    best: dict[int, tuple[float, str]] = {}
    for row in rows:
        if row["algorithm"] in ALL_REDUCE and \
                (row["nbytes"] not in best or row["seconds"] < best[row["nbytes"]][0]):
            best[row["nbytes"]] = (row["seconds"], row["algorithm"])
    return {nbytes: name for nbytes, (_, name) in sorted(best.items())}


def predicted_switches(costs: AlgorithmCosts, world_size: int, low: int = 2 ** 10,
                       high: int = 2 ** 26) -> list[tuple[int, str, str]]:
    """(size, from, to) where the choice of `costs` changes between `low` and `high` bytes.

    Scans sizes 2^(1/8) apart, then bisects each change down to a byte: the expected crossovers
    (two switches closer than an eighth of an octave would show as one).
    """
    switches, nbytes, step = [], low, 2 ** 0.125
    while nbytes < high:
        following = min(high, max(nbytes + 1, round(nbytes * step)))
        before, after = costs.choose(nbytes, world_size), costs.choose(following, world_size)
        if before != after:
            left, right = nbytes, following
            while right - left > 1:
                middle = (left + right) // 2
                left, right = (middle, right) if costs.choose(middle, world_size) == before \
                    else (left, middle)
            switches.append((right, before, costs.choose(right, world_size)))
        nbytes = following
    return switches


def stored_times(path: Path | str = STORED) -> list[dict]:
    """The rows {algorithm, world_size, nbytes, seconds} stored by `make bench`, as numbers."""
    with open(path, newline="") as handle:
        lines = [line for line in handle if not line.startswith("#")]
    return [{"algorithm": row["algorithm"], "world_size": int(row["world_size"]),
             "nbytes": int(row["nbytes"]), "seconds": float(row["seconds"])}
            for row in csv.DictReader(lines)]


@lru_cache(maxsize=8)
def stored_costs(path: Path | str | None = None, collective: str = "all_reduce") -> AlgorithmCosts:
    """Costs of `collective` fitted to the times stored with the package (by `make bench`).

    `path` defaults to `STORED_FILES[collective]`. Read and fitted once per process (the file
    does not change while it runs), since "auto" asks for them on every call.
    """
    require_choice("collective", collective, tuple(ALGORITHMS))
    path = STORED_FILES[collective] if path is None else path
    return AlgorithmCosts.from_times(stored_times(path), source=str(path), collective=collective)


def store_times(rows: list[dict], note: str, path: Path | str = STORED) -> Path:
    """Write rows {algorithm, world_size, nbytes, seconds} for `stored_costs`, after `note`
    (where and when they were measured) as comment lines."""
    path = Path(path)
    with open(path, "w", newline="") as handle:
        handle.writelines(f"# {line}\n" for line in note.splitlines())
        writer = csv.DictWriter(handle, fieldnames=["algorithm", "world_size", "nbytes", "seconds"])
        writer.writeheader()
        writer.writerows({key: row[key] for key in writer.fieldnames} for row in rows)
    return path


def time_algorithms(world_size: int, sizes=CALIBRATION_SIZES, trials: int = 3,
                    min_trial_s: float = 0.02, group=None) -> list[dict]:
    """Rows {algorithm, world_size, nbytes, seconds} for every algorithm at every size.

    Collective: call on every rank. Each time is the slowest rank's median (`timing`).
    """
    rows = []
    for nbytes in sizes:
        tensor = torch.ones(max(nbytes // 4, 1), device=current_device())
        for name, algorithm in ALL_REDUCE.items():
            seconds, _ = collective_seconds(partial(algorithm, tensor, "sum", group=group),
                                            trials=trials, min_trial_s=min_trial_s)
            rows.append({"algorithm": name, "world_size": world_size, "nbytes": nbytes,
                         "seconds": seconds})
    return rows


def calibrate(world_size: int, group=None) -> AlgorithmCosts:
    """Measure every algorithm here, briefly, and fit. Collective: call on every rank.

    The times are each the slowest rank's, so every rank fits the same constants.
    """
    return AlgorithmCosts.from_times(time_algorithms(world_size, group=group),
                                     source=f"calibrated on {world_size} ranks")


def all_reduce(tensor: torch.Tensor, op: str = "sum", *, algorithm: str = "auto",
               costs: AlgorithmCosts | None = None, group=None, ledger: CommLedger | None = None,
               timeout_s: float = DEFAULT_WAIT_S) -> torch.Tensor:
    """Reduce `tensor` over all ranks in place with `algorithm`; return it.

    Collective: call on every rank with tensors of the same shape and dtype, and the same
    `algorithm` and `costs`. "auto" picks the algorithm `costs` (default: `stored_costs()`)
    predicts fastest for this size and world size. Raises ValueError for an unknown algorithm
    or op, or op="avg" on an integer tensor.
    """
    require_choice("algorithm", algorithm, CHOICES)
    if algorithm == "auto":
        algorithm = (costs or stored_costs()).choose(tensor.numel() * tensor.element_size(),
                                                    dist.get_world_size(group))
    return ALL_REDUCE[algorithm](tensor, op, group=group, ledger=ledger, timeout_s=timeout_s)


def _chosen(collective: str, algorithm: str, costs: AlgorithmCosts | None, nbytes: int,
            group) -> str:
    """`algorithm`, or for "auto" the one `costs` (default: the stored ones) predicts fastest."""
    require_choice("algorithm", algorithm, ("auto", *ALGORITHMS[collective]))
    if algorithm != "auto":
        return algorithm
    costs = costs or stored_costs(collective=collective)
    if costs.collective != collective:
        raise ValueError(f"costs fitted for {costs.collective} cannot choose the {collective} algorithm: "
                         f"pass choose.stored_costs(collective={collective!r})")
    return costs.choose(nbytes, dist.get_world_size(group))


def reduce_scatter(tensor: torch.Tensor, op: str = "sum", *, algorithm: str = "auto",
                   costs: AlgorithmCosts | None = None, group=None,
                   ledger: CommLedger | None = None,
                   timeout_s: float = DEFAULT_WAIT_S) -> torch.Tensor:
    """This rank's chunk `torch.tensor_split(reduced, N)[rank]` (dim 0) of the reduction of `tensor`.

    Collective: call on every rank with tensors of the same shape and dtype, and the same
    `algorithm` and `costs`. "auto" picks "ring", "direct" or "naive" by the tensor's size, from
    `stored_costs(collective="reduce_scatter")` unless `costs` is given. Raises ValueError for an
    unknown algorithm or op, or op="avg" on an integer tensor.
    """
    name = _chosen("reduce_scatter", algorithm, costs, tensor.numel() * tensor.element_size(),
                   group)
    return REDUCE_SCATTER[name](tensor, op, group=group, ledger=ledger, timeout_s=timeout_s)


def all_gather(shard: torch.Tensor, sizes: list[int] | None = None, *, algorithm: str = "auto",
               costs: AlgorithmCosts | None = None, group=None, ledger: CommLedger | None = None,
               timeout_s: float = DEFAULT_WAIT_S) -> torch.Tensor:
    """Every rank's `shard` concatenated along dim 0 in rank order; `sizes[r]` is rank r's length.

    Collective: call on every rank, with the same `sizes`, `algorithm` and `costs`. "auto" picks
    by the gathered size, which needs `sizes` (every rank must choose alike): without them it
    runs the ring, which exchanges the lengths first. Raises ValueError as `ring_all_gather`, or
    for an unknown algorithm.
    """
    if sizes is None and algorithm == "auto":
        algorithm = "ring"
    row_bytes = math.prod(shard.shape[1:]) * shard.element_size()
    nbytes = sum(int(size) for size in sizes) * row_bytes if sizes is not None else 0
    name = _chosen("all_gather", algorithm, costs, nbytes, group)
    return ALL_GATHER[name](shard, sizes, group=group, ledger=ledger, timeout_s=timeout_s)
