"""Collectives that choose their algorithm by message size and world size (lesson 76).

Short messages cost mostly latency (alpha per step), long ones bandwidth (beta per byte), so no
one algorithm wins everywhere: recursive doubling takes few steps, the ring and halving-doubling
move the fewest bytes, the direct algorithms send them in one round, and ranks on one machine can
skip sending altogether through shared memory (`shared_memory`, whose two barriers through
rank 0 are 4(N-1) messages in a row).
`all_reduce(..., algorithm="auto")` expects each algorithm's time from times measured on this
kind of machine (read between the measured sizes, and beyond them from the alpha-beta model of
`cost_model` fitted to them), and runs the fastest; `reduce_scatter` and `all_gather` choose
between the ring, the direct and the naive (through rank 0) algorithm the same way, each from
its own stored times. Libraries choose by size too: MPICH and Open MPI by thresholds tuned by
measurement, NCCL from a model of each algorithm's latency and bandwidth on the topology it
detects.

The times come from `stored_costs()`: this machine's own, which `make bench` writes into
bench-results/, where they were measured on a machine described by the same line; otherwise the
times stored with the package (the book's), with the machine and date they were measured on.
A table of this machine's that cannot be read (a run of `make bench` cut short before its
tables were written whole) is skipped for the package's, which rank 0 says in one line.
`calibrate()` measures on the ranks themselves instead (a few seconds, the same on every rank).

Every rank must choose the same algorithm, or they wait for each other's messages until a
timeout. But each rank reads the files of its own machine, and two nodes can hold different
tables. So "auto" never decides from a rank's own table: the first time a group uses it for a
collective, rank 0's table of decisions (`Decisions`: from which size on which algorithm runs,
integers and names) is broadcast to every rank, and every rank decides from that one table;
a rank whose own table would have decided otherwise says so in one line. Costs passed as
`costs=` are agreed the same way (`costs_decisions`).

    from lesson_code.collectives import all_reduce
    all_reduce(tensor, "sum")                          # call on every rank; in place
    all_reduce(tensor, "sum", algorithm="recursive_doubling")
    reduce_scatter(tensor, "sum"); all_gather(shard, sizes)   # chosen alike
"""

from __future__ import annotations

import bisect
import csv
import math
import os
import sys
import weakref
from dataclasses import dataclass, field
from datetime import timedelta
from functools import lru_cache, partial
from pathlib import Path

import torch
import torch.distributed as dist

from lesson_code.collectives import cost_model, direct, doubling, naive, ring, shared_memory
from lesson_code.collectives.ledger import CommLedger
from lesson_code.collectives.p2p import DEFAULT_WAIT_S
from lesson_code.runtime.devices import current_device
from lesson_code.harness.files import replacing
from lesson_code.harness.timing import collective_seconds, machine_line
from lesson_code.harness.validate import require_choice

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
LARGEST_DECIDED = 2 ** 44  # bytes: a decision table covers 0 to here; larger sizes take its last


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
        straight line joining them on log-log axes: two constants cannot follow every step a
        real machine shows (on the book's stored tables the fit misses single sizes by tens of
        percent, enough to rank two algorithms the wrong way).
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

    def decisions(self, world_size: int) -> "Decisions":
        """What `choose` runs at every size on `world_size` ranks, as a table of steps.

        Found by `predicted_switches` from 0 to LARGEST_DECIDED bytes (a few milliseconds).
        """
        switches = predicted_switches(self, world_size, low=0, high=LARGEST_DECIDED)
        return Decisions(self.collective, world_size,
                         starts=(0, *(size for size, _, _ in switches)),
                         algorithms=(self.choose(0, world_size), *(to for _, _, to in switches)),
                         source=self.source)

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


@dataclass(frozen=True)
class Decisions:
    """Which algorithm "auto" runs for a message of each size, on one group: from `starts[i]`
    bytes on (up to the next start), `algorithms[i]`. Integers and names only, so every rank
    holding the same table decides the same, whatever its floating-point arithmetic."""

    collective: str
    world_size: int
    starts: tuple[int, ...]  # ascending, starting at 0
    algorithms: tuple[str, ...]
    source: str = ""

    def choose(self, nbytes: int) -> str:
        """The algorithm for a message of `nbytes` bytes."""
        return self.algorithms[bisect.bisect_right(self.starts, nbytes) - 1]


def agree(collective: str, own: Decisions | None, group=None,
          device: torch.device | None = None, timeout_s: float = DEFAULT_WAIT_S) -> Decisions:
    """Rank 0's decisions for `collective`, on every rank of `group`; `own` is this rank's.

    Collective: call on every rank (two broadcasts of a few integers, each wait bounded by
    `timeout_s`), with tensors on `device` (default: this rank's). A rank whose own table
    differs from rank 0's, or that has none (None: it could not read its times), follows rank
    0's like every rank, and prints one line that says so when its own differs. Raises
    RuntimeError on every rank when rank 0 has none to give.
    """
    device = device or current_device()
    rank, wait = dist.get_rank(group), timedelta(seconds=timeout_s)
    root = dist.get_global_rank(group, 0) if group is not None else 0
    names = list(ALGORITHMS[collective])
    rows = [[start, names.index(name)] for start, name in
            zip(own.starts, own.algorithms)] if own else []
    count = torch.tensor([len(rows) if own else -1], dtype=torch.int64, device=device)
    dist.broadcast(count, src=root, group=group, async_op=True).wait(wait)
    if int(count.item()) < 0:
        raise RuntimeError(f"rank 0 could not read the {collective} times `auto` decides from "
                           "(its message is above): repair its table, or pass algorithm=")
    table = torch.tensor(rows, dtype=torch.int64, device=device) if rank == 0 else \
        torch.empty((int(count.item()), 2), dtype=torch.int64, device=device)
    dist.broadcast(table, src=root, group=group, async_op=True).wait(wait)
    starts, indices = zip(*table.cpu().tolist())
    agreed = Decisions(collective, dist.get_world_size(group), starts=tuple(starts),
                       algorithms=tuple(names[index] for index in indices),
                       source=own.source if rank == 0 else "rank 0's table")
    if own and (agreed.starts, agreed.algorithms) != (own.starts, own.algorithms):
        print(f"lesson_code: rank {rank}: its {collective} times ({own.source}) decide "
              "otherwise than rank 0's; it follows rank 0's, as every rank must",
              file=sys.stderr, flush=True)
    return agreed


@lru_cache(maxsize=1)
def agreed_decisions() -> weakref.WeakKeyDictionary:
    """This process's agreed tables: {group object: {collective: Decisions}}. Weak keys: a
    table goes with its group, and no group outlives its destruction because of it (a group
    object destroyed at interpreter exit instead aborts the process)."""
    return weakref.WeakKeyDictionary()


def group_decisions(collective: str, group=None, device: torch.device | None = None,
                    timeout_s: float = DEFAULT_WAIT_S) -> Decisions:
    """The decisions "auto" follows for `collective` on `group`: rank 0's table of its stored
    times (`stored_costs`), agreed the first time the group asks (collective then: every rank
    asks at the same call; see `agree` for `device` and `timeout_s`), and kept for the group's
    life (a new group agrees anew, or `decide_from` sets them). Only rank 0 must be able to
    read its times: another rank that cannot says so and follows rank 0's."""
    tables = agreed_decisions().setdefault(group if group is not None else dist.group.WORLD, {})
    if collective not in tables:
        tables[collective] = agree(collective, _own_decisions(collective, None, group), group,
                                   device, timeout_s)
    return tables[collective]


def decide_from(folder: Path | str, group=None, device: torch.device | None = None,
                timeout_s: float = DEFAULT_WAIT_S) -> dict[str, Decisions]:
    """Make "auto" on `group` follow rank 0's tables in `folder` (each collective's file, named
    as in STORED_FILES), whatever machine they were measured on, instead of `stored_costs()`'s;
    return the agreed decisions of every collective.

    Collective: call on every rank, before the group's first "auto" (see `agree` for `device`
    and `timeout_s`). The benchmark uses it to time "auto" with the tables it has just
    written, wherever it wrote them. Raises RuntimeError on every rank when rank 0 cannot
    read a table of `folder`.
    """
    tables = agreed_decisions().setdefault(group if group is not None else dist.group.WORLD, {})
    for collective, packaged in STORED_FILES.items():
        own = _own_decisions(collective, Path(folder) / packaged.name, group)
        tables[collective] = agree(collective, own, group, device, timeout_s)
    return dict(tables)


def _own_decisions(collective: str, path: Path | None, group) -> Decisions | None:
    """This rank's decisions from `stored_costs(path, collective)`, or None, said in one line,
    when it cannot read them (rank 0's None then raises on every rank, in `agree`)."""
    try:
        return stored_costs(path, collective).decisions(dist.get_world_size(group))
    except (OSError, ValueError) as error:
        print(f"lesson_code: rank {dist.get_rank(group)}: cannot read its {collective} times "
              f"({error})", file=sys.stderr, flush=True)
        return None


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


COLUMNS = ("algorithm", "world_size", "nbytes", "seconds")


def stored_times(path: Path | str = STORED) -> list[dict]:
    """The rows {algorithm, world_size, nbytes, seconds} stored by `make bench`, as numbers.

    Raises ValueError naming the file and the line of the first row that is not whole (a
    field missing, or not a positive number: a file cut short), or of a header without these
    columns; OSError when the file cannot be read.
    """
    with open(path, newline="", encoding="utf-8") as handle:
        numbered = [(number, line) for number, line in enumerate(handle, start=1)
                    if not line.startswith("#")]
    reader = csv.DictReader(line for _, line in numbered)
    if not set(COLUMNS) <= set(reader.fieldnames or ()):
        where = f"line {numbered[0][0]}" if numbered else "no line"
        raise ValueError(f"{path}, {where}: the header is not {','.join(COLUMNS)}: "
                         f"{_repair(path)}")
    rows = []
    for row in reader:
        try:  # a field cut off reads as None, one cut to nothing as ""
            parsed = {"algorithm": row["algorithm"], "world_size": int(row["world_size"]),
                      "nbytes": int(row["nbytes"]), "seconds": float(row["seconds"])}
        except (TypeError, ValueError):
            parsed = None
        if parsed is None or None in row or not parsed["algorithm"] or \
                not (parsed["world_size"] > 0 and parsed["nbytes"] > 0
                     and 0 < parsed["seconds"] < math.inf):
            number, line = numbered[reader.line_num - 1]
            raise ValueError(f"{path}, line {number}: {line.rstrip()!r} is not a whole row of "
                             f"{','.join(COLUMNS)}: {_repair(path)}")
        rows.append(parsed)
    return rows


def _repair(path: Path | str) -> str:
    """What to do about a damaged table at `path`."""
    if Path(path).parent == STORED.parent:
        return "reinstall lesson_code, or in a checkout restore the file with git"
    return ("measure again (python -m lesson_code.bench collectives, or make bench), or delete "
            "the file")


RESULTS_VARIABLE = "LESSON_CODE_RESULTS"  # another folder for this machine's tables


def results_folder() -> Path:
    """Where `make bench` writes this machine's tables, and "auto" looks for them: the folder
    named by LESSON_CODE_RESULTS when set; else bench-results/ at the root of the checkout the
    package runs from (beside the package, never in it); else in the working directory."""
    if os.environ.get(RESULTS_VARIABLE):
        return Path(os.environ[RESULTS_VARIABLE])
    root = Path(__file__).resolve().parents[2]
    return (root if (root / "pyproject.toml").is_file() else Path.cwd()) / "bench-results"


def measured_here(collective: str) -> Path | None:
    """This machine's own times of `collective` in `results_folder()`, if they were measured on
    a machine described by the same `machine_line()` (the load average the line may end with
    says how busy it was, not which machine it was); else None."""
    path = results_folder() / STORED_FILES[collective].name
    try:
        with open(path) as handle:
            lines = [line for line in handle if line.startswith("# machine: ")]
    except OSError:
        return None
    machine = lines[0].strip().split(", load average ")[0] if lines else None
    return path if machine == f"# machine: {machine_line()}" else None


@lru_cache(maxsize=8)
def stored_costs(path: Path | str | None = None, collective: str = "all_reduce") -> AlgorithmCosts:
    """Costs of `collective` fitted to stored times: those of `path`; by default this machine's
    own (`measured_here`), else the package's (`STORED_FILES[collective]`, the book's).

    Read and fitted once per process (the files do not change while it runs). By default,
    this machine's table that cannot be read or fitted gives way to the package's, said in one
    line by one process (`say_once`: rank 0, or a process outside any group); a table named by
    `path`, or the package's, raises ValueError (naming the file and line) or OSError.
    """
    require_choice("collective", collective, tuple(ALGORITHMS))
    if path is None and (own := measured_here(collective)) is not None:
        try:
            return stored_costs(own, collective)
        except (OSError, ValueError) as error:
            say_once(f"lesson_code: {error}. Until then `auto` decides from the package's "
                     f"{collective} times ({STORED_FILES[collective]})")
    path = path or STORED_FILES[collective]
    return AlgorithmCosts.from_times(stored_times(path), source=str(path), collective=collective)


@lru_cache(maxsize=None)
def say_once(line: str) -> None:
    """Print `line` to stderr the first time this process is asked to, and only in rank 0 of
    the default group (or in a process outside any group): every rank reads the same file and
    would say the same, and the ranks of a notebook's run all print into its cell."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(line, file=sys.stderr, flush=True)


def store_times(rows: list[dict], note: str, path: Path | str = STORED) -> Path:
    """Write rows {algorithm, world_size, nbytes, seconds} for `stored_costs`, after `note`
    (where and when they were measured) as comment lines. The file is replaced whole
    (`files.replacing`): a write cut short leaves the old table, never a part of the new."""
    path = Path(path)
    with replacing(path) as handle:
        handle.writelines(f"# {line}\n" for line in note.splitlines())
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
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


def calibrate(world_size: int, group=None, sizes=CALIBRATION_SIZES) -> AlgorithmCosts:
    """Measure every all-reduce algorithm on these ranks at `sizes` (bytes), briefly, and fit:
    the costs to pass as `all_reduce(..., costs=)`. Collective: call on every rank.

    Unlike `make bench`, which starts its ranks on one machine, this times the group it is
    called on, wherever its ranks run: across machines the shared-memory row times the direct
    all-reduce it falls back to, which is what would run. The times are each the slowest
    rank's, so every rank fits the same constants; "auto" still follows rank 0's decisions
    from them (`costs_decisions`), so that floating point cannot part the ranks.
    """
    return AlgorithmCosts.from_times(time_algorithms(world_size, sizes, group=group),
                                     source=f"calibrated on {world_size} ranks")


def all_reduce(tensor: torch.Tensor, op: str = "sum", *, algorithm: str = "auto",
               costs: AlgorithmCosts | None = None, group=None, ledger: CommLedger | None = None,
               timeout_s: float = DEFAULT_WAIT_S) -> torch.Tensor:
    """Reduce `tensor` over all ranks in place with `algorithm`; return it.

    Collective: call on every rank with tensors of the same shape and dtype, and the same
    `algorithm` and `costs`. "auto" picks the algorithm predicted fastest for this size and
    world size: by rank 0's `costs` when given (`costs_decisions`), else by the group's agreed
    table (`group_decisions`). Raises ValueError for an unknown algorithm
    or op, or op="avg" on an integer tensor.
    """
    name = _chosen("all_reduce", algorithm, costs, tensor, tensor.numel() * tensor.element_size(),
                   group, timeout_s)
    return ALL_REDUCE[name](tensor, op, group=group, ledger=ledger, timeout_s=timeout_s)


def _chosen(collective: str, algorithm: str, costs: AlgorithmCosts | None, tensor: torch.Tensor,
            nbytes: int, group, timeout_s: float) -> str:
    """`algorithm`, or for "auto" the one predicted fastest: by `costs` when given, else by
    the group's agreed decisions (`group_decisions`, on `tensor`'s device: a communicator may
    call from a thread of its own, whose current GPU is not the rank's)."""
    require_choice("algorithm", algorithm, ("auto", *ALGORITHMS[collective]))
    if algorithm != "auto":
        return algorithm
    if costs is None:
        return group_decisions(collective, group, tensor.device, timeout_s).choose(nbytes)
    if costs.collective != collective:
        raise ValueError(f"costs fitted for {costs.collective} cannot choose the {collective} algorithm: "
                         f"pass choose.stored_costs(collective={collective!r})")
    return costs_decisions(costs, group, tensor.device, timeout_s).choose(nbytes)


def costs_decisions(costs: AlgorithmCosts, group=None, device: torch.device | None = None,
                    timeout_s: float = DEFAULT_WAIT_S) -> Decisions:
    """The decisions "auto" follows on `group` when given `costs`: rank 0's, from its `costs`.

    Each rank's costs are fitted in floating point, from times its own machine may have read
    or measured: near a switch two ranks could decide apart and wait for each other until a
    timeout. So, as for the stored tables, rank 0's decisions are broadcast (`agree`) the first
    time the group uses a `costs` object (collective then: every rank passes its own at the
    same call), and kept with the object for the group's life.
    """
    agreed = agreed_costs_decisions().setdefault(
        group if group is not None else dist.group.WORLD, {})
    if id(costs) not in agreed:  # the object is kept beside its decisions: its id stays its own
        agreed[id(costs)] = (costs, agree(costs.collective,
                                          costs.decisions(dist.get_world_size(group)),
                                          group, device, timeout_s))
    return agreed[id(costs)][1]


@lru_cache(maxsize=1)
def agreed_costs_decisions() -> weakref.WeakKeyDictionary:
    """This process's decisions agreed from `costs=`: {group: {id(costs): (costs, Decisions)}};
    weak keys, as in `agreed_decisions`."""
    return weakref.WeakKeyDictionary()


def reduce_scatter(tensor: torch.Tensor, op: str = "sum", *, algorithm: str = "auto",
                   costs: AlgorithmCosts | None = None, group=None,
                   ledger: CommLedger | None = None,
                   timeout_s: float = DEFAULT_WAIT_S) -> torch.Tensor:
    """This rank's chunk `torch.tensor_split(reduced, N)[rank]` (dim 0) of the reduction of `tensor`.

    Collective: call on every rank with tensors of the same shape and dtype, and the same
    `algorithm` and `costs`. "auto" picks "ring", "direct" or "naive" by the tensor's size, by
    `costs` when given, else by the group's agreed table (`group_decisions`). Raises ValueError for an
    unknown algorithm or op, or op="avg" on an integer tensor.
    """
    name = _chosen("reduce_scatter", algorithm, costs, tensor,
                   tensor.numel() * tensor.element_size(), group, timeout_s)
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
    name = _chosen("all_gather", algorithm, costs, shard, nbytes, group, timeout_s)
    return ALL_GATHER[name](shard, sizes, group=group, ledger=ledger, timeout_s=timeout_s)
