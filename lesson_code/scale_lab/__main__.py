"""`python -m lesson_code.scale_lab`: lesson 78's scale lab from a shell.

    python -m lesson_code.scale_lab                     # the sweep, the paper's table, the pipeline
    python -m lesson_code.scale_lab --lang fa           # the same report in Persian
    python -m lesson_code.scale_lab --world-sizes 4,64 --skip paper,pipeline
    python -m lesson_code.scale_lab --stages 1,4,16,64,256,512   # more pipelines (default 1,16,512)
    python -m lesson_code.scale_lab --check             # also N = 4 against 4 real gloo ranks
    python -m lesson_code.scale_lab --into-package      # also store the sweep for the book

The default report takes about 50 s of one core (measured on a 2-core laptop-class machine):
the sweep and the paper's table about 17 s each, the pipeline 3 s per number of stages.
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
from lesson_code.scale_lab import pipelined, report, stored

PARTS = ("sweep", "paper", "pipeline")


def counts(text: str) -> tuple[int, ...]:
    """`type=` for --world-sizes and --stages: whole numbers of 1 or more, separated by commas."""
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
    parser.add_argument("--world-sizes", type=counts, default=scale_lab.SWEEP_SIZES,
                        help="simulated world sizes of the sweep, e.g. 1,4,64,512 (default: "
                             "powers of 2 from 1 to 512)")
    parser.add_argument("--stages", type=counts, default=pipelined.STAGE_COUNTS,
                        help="numbers of pipeline stages, at most 512, e.g. 1,4,16,64,256,512 "
                             "(default: 1,16,512; each takes 3 to 5 s)")
    parser.add_argument("--skip", type=parts, default=(),
                        help=f"parts of the report to leave out, among {', '.join(PARTS)}")
    parser.add_argument("--check", action="store_true",
                        help="also run 4 real gloo ranks and compare them with the simulation")
    parser.add_argument("--into-package", action="store_true",
                        help="store the sweep in the package (lesson_code/scale_lab/sweep.csv), "
                             "replacing the one the book reads; needs the default world sizes")
    cli_args.add_language(parser)
    args = parser.parse_args(argv)
    if args.into_package and ("sweep" in args.skip or args.world_sizes != scale_lab.SWEEP_SIZES):
        parser.error("--into-package stores the whole sweep: leave out --world-sizes and do not "
                     "skip the sweep")
    layers = pipelined.PipelineScaleRun().gpt.n_layer + 2  # the embedding and the head too
    if max(args.stages) > layers:
        parser.error(f"--stages {max(args.stages)}: the pipeline's model has {layers} layers, "
                     f"one per stage at most: pass numbers of stages up to {layers}")
    lang, started, ok = args.lang, time.perf_counter(), True
    lines = report.header(lang, pipeline="pipeline" not in args.skip)
    if "sweep" not in args.skip:
        run = scale_lab.ScaleRun()
        table = scale_lab.sweep(run, args.world_sizes)
        matches = scale_lab.mismatches(table).empty
        lines += report.sweep_lines(table, run.parameters, run.dtype, lang)
        lines.append(report.say("matches", lang, ok=matches))
        lines += report.reads_lines(table, lang)
        ok &= matches
        if args.into_package:
            path = stored.write(table, report.stored_description(run))
            lines.append(report.say("stored_to", lang, path=path.relative_to(path.parents[2])))
    if "paper" not in args.skip:
        paper = scale_lab.paper_table()
        lines += report.paper_lines(paper, lang)
        ok &= bool(paper.agrees.all())
    if "pipeline" not in args.skip:
        stages = pipelined.sweep(stage_counts=args.stages)
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
