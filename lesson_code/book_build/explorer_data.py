"""What the lessons' offline explorers read from the package: measured constants, as JSON.

An explorer (book/static/explorer-NN.js) computes in the browser with the package's formulas,
re-written in JavaScript and tested against the Python on a grid (tests/book/test_explorers.py).
The numbers those formulas take from measurements (fitted alpha and beta, auto's decisions) it
cannot compute: the book's extension writes them into the lesson's page from here, so the page
and the package read the very same stored tables.
"""

from __future__ import annotations

import re
from functools import lru_cache

from lesson_code import ddp_lab
from lesson_code.bench import capstone as capstone_bench
from lesson_code.bench import ddp as ddp_bench
from lesson_code.bench import stored
from lesson_code.collectives import choose, cost_model
from lesson_code.models import GPTConfig

RING_WORLD_SIZES = range(2, 17)  # the ranks lesson 76's explorer offers


@lru_cache(maxsize=None)
def collectives() -> dict:
    """Lesson 76: each all-reduce algorithm's cost-model name, the modelled cluster's one (alpha,
    beta) for all of them (`cost_model.CLUSTER`), auto's decisions for every world size offered,
    which come from the book's stored times, and when and on what machine those times were
    measured (from the file's comment lines)."""
    costs = choose.stored_costs(choose.STORED)
    with open(choose.STORED, encoding="utf-8") as handle:
        note = [line[2:].strip() for line in handle if line.startswith("# ")]
    return {
        "models": {name: choose.MODEL_NAMES["all_reduce"][name] for name in costs.fits},
        "cluster": [cost_model.CLUSTER.alpha, cost_model.CLUSTER.beta],
        "decisions": {str(n): {"starts": list(table.starts), "algorithms": list(table.algorithms)}
                      for n in RING_WORLD_SIZES for table in [costs.decisions(n)]},
        "measured": _measured(note),
    }


def _measured(note: list[str] | str) -> dict:
    """{date, machine} from a stored table's comment lines (`_measured_on`)."""
    text = " ".join(note) if isinstance(note, list) else note
    date, machine = re.search(r"measured (\d{4}-\d{2}-\d{2})", text), re.search(r"machine: (.*)$", text)
    return _measured_on(date and date.group(1), machine and machine.group(1))


def _measured_on(date: str | None, machine: str | None) -> dict:
    """When and where a stored table was measured, as an explorer's note shows it: the machine
    line in each edition's words (the Persian one as the lessons' stored-table notes print it)."""
    return {"date": date, "machine": machine and {"en": machine, "fa": stored.persian_machine(machine)}}


@lru_cache(maxsize=None)
def capstone() -> dict:
    """Lesson 81: the stored loss curve of the capstone command with a learning-rate spike (steps
    and the guard's events, `bench.capstone.read_curve`), when and where it was measured, and the
    capstone model's shape (the explorer varies its depth and width)."""
    note, rows = capstone_bench.read_curve()
    config = GPTConfig()
    return {"curve": rows, "measured": _measured(note),
            "gpt": {"vocab_size": config.vocab_size, "context": config.context,
                    "n_layer": config.n_layer, "n_embd": config.n_embd}}


@lru_cache(maxsize=None)
def ddp() -> dict:
    """Lesson 77: the gradients' bytes of the benchmark's MiniGPT in the order backward makes
    them and the backward's work before each (`ddp_lab.backward_work`, 8 sequences per rank),
    the ring's alpha and beta on the 4 ranks the book measured, and from the stored
    benchmark (our bucketed ring) the step and the wait measured per bucket size and the backward
    time of its one-bucket row: with every gradient in one bucket, its all-reduce starts when the
    backward has ended, so that row times the backward with no communication beside it. Under
    "cluster", the same inputs for ddp_lab.ModelledCluster (modelled, nothing measured)."""
    table, note = stored.load("ddp")
    sizes = ddp_lab.gradient_sizes(ddp_bench.BENCH_GPT)
    work = ddp_lab.backward_work(ddp_bench.BENCH_GPT, ddp_bench.SEQUENCES)
    costs = choose.stored_costs(choose.STORED)
    ring, (world_size, _) = costs.fits["ring"], costs.measured["ring"]
    ours = table[(table["wrapper"] == "bucketed") & (table["comm"] == "ring")]
    one_bucket = ours.loc[ours["bucket_mb"].idxmax()]
    if one_bucket["bucket_mb"] * 2 ** 20 < sum(sizes):
        raise ValueError(f"the stored benchmark's largest bucket ({one_bucket['bucket_mb']} MiB) is "
                         f"smaller than the gradients ({sum(sizes) / 2 ** 20:.1f} MiB): re-measure "
                         "with python -m lesson_code.bench ddp --into-package")
    return {"sizes": sizes, "work": work, "world_size": world_size,
            "backward_s": float(one_bucket["backward_ms"]) / 1e3, "alpha": ring.alpha, "beta": ring.beta,
            "measured_wait_ms": {f"{row['bucket_mb']:g}": float(row["wait_ms"])
                                 for _, row in ours.iterrows()},
            "measured_step_ms": {f"{row['bucket_mb']:g}": float(row["step_ms"])
                                 for _, row in ours.iterrows()},
            "measured": _measured_on(note["measured"], note["machine"]),
            "cluster": ddp_lab.ModelledCluster().inputs()}


@lru_cache(maxsize=None)
def zero_stages() -> dict:
    """Lesson 78a: the units ZeRO-3 gathers in the MiniGPT whose steps lesson 78a measures, as
    (name, parameters) in forward order (`zero_lab.stage3_units`), what the stored table of
    `bench zero_stages` measured of ZeRO-3 for each world size (the peak, where it fell, the
    formula beside it), and when and on what machine."""
    from lesson_code import zero_lab  # here: the other explorers need no model built

    table, note = stored.load("zero_stages")
    rows = table[table["stage"] == "ZeRO-3"]
    return {"units": [[name, numel] for name, numel in zero_lab.stage3_units()],
            "measured_peaks": {str(n): {"peak": int(row["peak"]), "peak_in": row["peak_in"],
                                        "formula": int(row["formula"])}
                               for n, row in rows.iterrows()},
            "measured": _measured_on(note["measured"], note["machine"])}


@lru_cache(maxsize=None)
def scale_points() -> dict:
    """Lesson 78's calculator: the bytes per rank that lesson 78b's scale lab measured on 1 to
    512 simulated ranks, per strategy, for the model it simulated (`scale_lab.measured_points`
    of the stored sweep, `lesson_code/scale_lab/sweep.csv`: read, not run), and when and on what
    machine and torch it was stored."""
    from lesson_code import scale_lab  # here: the other explorers need no simulation
    from lesson_code.scale_lab import stored as scale_stored

    table, note = scale_stored.load()
    return {**scale_lab.measured_points(table),
            "measured": _measured_on(note["measured"], note["machine"])}


LESSONS = {"76-collectives": collectives, "77-ddp": ddp, "78-zero": scale_points,
           "78a-zero-stages": zero_stages, "81-capstone": capstone}


def for_lesson(name: str) -> dict | None:
    """The data of lesson `name`'s explorers ("76-collectives"), or None when they need none."""
    made = LESSONS.get(name)
    return made() if made else None
