"""All-reduce that chooses its algorithm by message size and world size (lesson 76).

Short messages cost mostly latency (alpha per step), long ones bandwidth (beta per byte), so no
one algorithm wins everywhere: recursive doubling takes the fewest steps, the ring and
halving-doubling move the fewest bytes. `all_reduce(..., algorithm="auto")` predicts each
algorithm's time with the alpha-beta model (`cost_model`), using constants fitted to times
measured on this kind of machine, and runs the fastest. NCCL and MPICH choose the same way, from
tables tuned per machine.

The constants come from `AlgorithmCosts`: `stored_costs()` (the times `make bench` stored with
the package, with the machine and date they were measured on) or `calibrate()` (a quick
measurement on the ranks themselves, a few seconds, agreed across ranks). Every rank must choose
the same algorithm, or they would wait for each other's messages forever: both sources give
every rank the same constants.

    from lesson_code.collectives import all_reduce
    all_reduce(tensor, "sum")                          # call on every rank; in place
    all_reduce(tensor, "sum", algorithm="recursive_doubling")
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path

import torch
import torch.distributed as dist

from lesson_code.collectives import cost_model, doubling, ring
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
}
CHOICES = ("auto", *ALL_REDUCE)
MODEL_NAME = {"ring": "all_reduce", "recursive_doubling": "recursive_doubling",
              "halving_doubling": "halving_doubling", "naive": "naive_all_reduce"}
STORED = Path(__file__).with_name("measured_all_reduce.csv")
CALIBRATION_SIZES = (2 ** 10, 2 ** 14, 2 ** 18, 2 ** 22)


@dataclass(frozen=True)
class AlgorithmCosts:
    """Fitted alpha and beta of each all-reduce algorithm, and where the times came from."""

    fits: dict[str, cost_model.AlphaBeta]
    source: str

    def predict(self, algorithm: str, nbytes: int, world_size: int) -> float:
        """Predicted seconds of `algorithm` on a tensor of `nbytes` bytes over `world_size`."""
        fit = self.fits[algorithm]
        return cost_model.predict(MODEL_NAME[algorithm], nbytes, world_size, fit.alpha, fit.beta)

    def choose(self, nbytes: int, world_size: int) -> str:
        """The algorithm with the smallest predicted time (the first listed on a tie)."""
        return min(self.fits, key=lambda name: self.predict(name, nbytes, world_size))

    @classmethod
    def from_times(cls, rows: list[dict], source: str) -> "AlgorithmCosts":
        """Fit each algorithm to rows {algorithm, world_size, nbytes, seconds}.

        The fit weighs each time by its inverse (relative error), so 1 KiB and 64 MiB count
        alike although their times differ a thousandfold.
        """
        fits = {}
        for name in ALL_REDUCE:
            mine = [row for row in rows if row["algorithm"] == name]
            if len(mine) >= 2:
                fits[name] = cost_model.fit_alpha_beta(
                    MODEL_NAME[name], int(mine[0]["world_size"]),
                    [float(row["nbytes"]) for row in mine], [float(row["seconds"]) for row in mine],
                    relative=True)
        if not fits:
            raise ValueError(f"no algorithm has times at two sizes in {source}: measure again")
        return cls(fits=fits, source=source)


def predicted_switches(costs: AlgorithmCosts, world_size: int, low: int = 2 ** 10,
                       high: int = 2 ** 26) -> list[tuple[int, str, str]]:
    """(size, from, to) where the model's choice changes between `low` and `high` bytes.

    Scans powers of two, then bisects each change down to a byte: the predicted crossovers.
    """
    switches, nbytes = [], low
    while nbytes < high:
        before, after = costs.choose(nbytes, world_size), costs.choose(2 * nbytes, world_size)
        if before != after:
            left, right = nbytes, 2 * nbytes
            while right - left > 1:
                middle = (left + right) // 2
                left, right = (middle, right) if costs.choose(middle, world_size) == before \
                    else (left, middle)
            switches.append((right, before, costs.choose(right, world_size)))
        nbytes *= 2
    return switches


def stored_times(path: Path | str = STORED) -> list[dict]:
    """The rows {algorithm, world_size, nbytes, seconds} stored by `make bench`, as numbers."""
    with open(path, newline="") as handle:
        lines = [line for line in handle if not line.startswith("#")]
    return [{"algorithm": row["algorithm"], "world_size": int(row["world_size"]),
             "nbytes": int(row["nbytes"]), "seconds": float(row["seconds"])}
            for row in csv.DictReader(lines)]


@lru_cache(maxsize=4)
def stored_costs(path: Path | str = STORED) -> AlgorithmCosts:
    """Costs fitted to the times stored with the package (written by `make bench`).

    Read and fitted once per process (the file does not change while it runs), since "auto"
    asks for them on every call.
    """
    return AlgorithmCosts.from_times(stored_times(path), source=str(path))


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
