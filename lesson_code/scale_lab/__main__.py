"""`python -m lesson_code.scale_lab`: lesson 78's scale lab from a shell.

    python -m lesson_code.scale_lab                     # the sweep, the paper's table, the pipeline
    python -m lesson_code.scale_lab --lang fa           # the same report in Persian
    python -m lesson_code.scale_lab --world-sizes 4,64 --skip paper,pipeline
    python -m lesson_code.scale_lab --check             # also N = 4 against 4 real gloo ranks

Exits 0 when every simulated rank holds what the formulas say over its padded shard, the
paper's figures come out as the paper prints them, every pipeline stage sends what lesson 79's
protocol sends (and, with --check, the simulation agrees with real ranks); 1 otherwise; 2 for
a bad argument.
"""

from __future__ import annotations

import argparse
import time

from lesson_code import scale_lab
from lesson_code.harness import cli_args
from lesson_code.scale_lab import pipelined, report

PARTS = ("sweep", "paper", "pipeline")


def world_sizes(text: str) -> tuple[int, ...]:
    """`type=` for --world-sizes: whole numbers of 1 or more, separated by commas."""
    return tuple(cli_args.positive_int(part) for part in text.split(","))


def parts(text: str) -> tuple[str, ...]:
    """`type=` for --skip: parts of the report, separated by commas."""
    names = tuple(part.strip() for part in text.split(","))
    unknown = [name for name in names if name not in PARTS]
    if unknown:
        raise argparse.ArgumentTypeError(f"{', '.join(map(repr, unknown))}: pass parts among "
                                         f"{', '.join(PARTS)}, separated by commas")
    return names


def main(argv: list[str] | None = None) -> int:
    """Simulate, compare with the formulas and the paper, print the report; the exit status."""
    parser = argparse.ArgumentParser(prog="python -m lesson_code.scale_lab",
                                     description=main.__doc__)
    parser.add_argument("--world-sizes", type=world_sizes, default=scale_lab.SWEEP_SIZES,
                        help="simulated world sizes of the sweep, e.g. 1,4,64,512 (default: "
                             "powers of 2 from 1 to 512)")
    parser.add_argument("--skip", type=parts, default=(),
                        help=f"parts of the report to leave out, among {', '.join(PARTS)}")
    parser.add_argument("--check", action="store_true",
                        help="also run 4 real gloo ranks and compare them with the simulation")
    cli_args.add_language(parser)
    args = parser.parse_args(argv)
    lang, started, ok = args.lang, time.perf_counter(), True
    lines = report.header(lang)
    if "sweep" not in args.skip:
        run = scale_lab.ScaleRun()
        table = scale_lab.sweep(run, args.world_sizes)
        matches = scale_lab.mismatches(table).empty
        lines += report.sweep_lines(table, run.parameters, run.dtype, lang)
        lines.append(report.say("matches", lang, ok=matches))
        lines += report.reads_lines(table, lang)
        ok &= matches
    if "paper" not in args.skip:
        paper = scale_lab.paper_table()
        lines += report.paper_lines(paper, lang)
        ok &= bool(paper.agrees.all())
    if "pipeline" not in args.skip:
        stages = pipelined.sweep()
        lines += report.pipeline_lines(stages, pipelined.PipelineScaleRun(), lang)
        ok &= bool((stages.sent == stages.formula_sent).all())
    if args.check:
        check, pipeline_check = scale_lab.compare_with_real(), pipelined.compare_with_real()
        lines += report.check_lines(check, pipeline_check, lang)
        ok &= bool(check[["held_equal", "sent_equal", "messages_equal"]].all().all()
                   and pipeline_check.traffic_equal.all())
    lines.append(report.say("seconds", lang, seconds=time.perf_counter() - started))
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
