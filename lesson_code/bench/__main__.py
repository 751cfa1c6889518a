"""Command line of the benchmarks: `python -m lesson_code.bench {collectives,...,all}`.

Tables go to bench-results/ (at the root of the checkout, `choose.results_folder()`), including
the measured tables the lessons read; the package's own copies of those change only with
`--into-package`, which whoever refreshes the book's figures passes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lesson_code.bench import capstone as capstone_bench
from lesson_code.bench import collectives as collectives_bench
from lesson_code.bench import ddp as ddp_bench
from lesson_code.bench import launch as launch_bench
from lesson_code.bench import pipeline as pipeline_bench
from lesson_code.bench import zero as zero_bench
from lesson_code.harness.cli_args import positive_int
from lesson_code.collectives import choose

BENCHMARKS = {"collectives": collectives_bench.run, "ddp": ddp_bench.run, "zero": zero_bench.run,
              "zero_stages": zero_bench.run_stages, "pipeline": pipeline_bench.run,
              "capstone": capstone_bench.run, "launch": launch_bench.run}
STORING = ("collectives", "ddp", "zero", "zero_stages", "pipeline", "capstone")  # store a table
REPEATING = ("pipeline", "capstone")  # they take --repeats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lesson_code.bench",
                                     description="Run a benchmark and print its table.")
    parser.add_argument("name", choices=[*BENCHMARKS, "all"])
    parser.add_argument("--world-size", type=positive_int, default=4)
    parser.add_argument("--out-dir", type=Path, default=choose.results_folder(),
                        help="where the tables go (default: %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help="fewer sizes and trials (a smoke run, not a measurement): stores nothing")
    parser.add_argument("--repeats", type=positive_int, default=None,
                        help="timed repeats of each measurement, for pipeline (steps) and "
                             "capstone (runs of each command); default: 7 and 3")
    parser.add_argument("--into-package", action="store_true",
                        help="store the measured tables the lessons show in the package itself "
                             "(lesson_code/measured_*.csv), replacing the book's")
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    names = list(BENCHMARKS) if args.name == "all" else [args.name]
    for name in names:
        extra = {"into_package": args.into_package} if name in STORING else {}
        if name in REPEATING:
            extra["repeats"] = args.repeats
        BENCHMARKS[name](world_size=args.world_size, out_dir=args.out_dir, quick=args.quick, **extra)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
