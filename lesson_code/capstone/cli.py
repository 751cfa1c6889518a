"""Command line of the capstone (lesson 81): `python -m lesson_code.capstone [--world-size N] ...`.

`python -m lesson_code.capstone --help` lists the options; under torchrun, torchrun's WORLD_SIZE
is the run's world size.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
from pathlib import Path

from lesson_code import launch
from lesson_code.harness.cli_args import (check_divides, check_in_range, check_world_size, positive_int,
                                  seed_int, world_size_in_use)
from lesson_code.capstone.config import CapstoneConfig
from lesson_code.capstone.report import loss_table, manifest_summary, memory_table, write_metrics
from lesson_code.capstone.train import compare_resumed, run_and_resume


def parse(argv: list[str] | None) -> CapstoneConfig:
    """The run's settings from the command line; a bad argument exits with status 2 (argparse)."""
    defaults = CapstoneConfig()
    parser = argparse.ArgumentParser(prog="python -m lesson_code.capstone",
                                     description="MiniGPT on N ranks: DDP + ZeRO-1 + sharded checkpoint")
    parser.add_argument("--world-size", type=positive_int, default=defaults.world_size,
                        help="ranks to spawn (under torchrun, torchrun decides)")
    parser.add_argument("--steps", type=positive_int, default=defaults.steps)
    parser.add_argument("--checkpoint-step", type=positive_int, default=defaults.checkpoint_step,
                        help="save the sharded checkpoint after this step (1..steps)")
    parser.add_argument("--out-dir", default=defaults.out_dir, help="metrics, plot and checkpoints")
    parser.add_argument("--seed", type=seed_int, default=defaults.seed)
    parser.add_argument("--accumulation", type=positive_int, default=defaults.accumulation,
                        help=f"micro-batches per step, a divisor of the batch per rank "
                             f"({defaults.batch_per_rank})")
    parser.add_argument("--lr-spike-step", type=positive_int, default=None,
                        help="inject a learning-rate spike at this step (tests the divergence guard)")
    args = parser.parse_args(argv)
    check_ranks_fit_corpus(parser, args.world_size, defaults)
    check_in_range(parser, "--checkpoint-step", args.checkpoint_step, 1, args.steps,
                   f"the checkpoint is saved after one of the run's {args.steps} steps (--steps)")
    if args.lr_spike_step is not None:
        check_in_range(parser, "--lr-spike-step", args.lr_spike_step, 1, args.steps,
                       f"the spike is injected at one of the run's {args.steps} steps (--steps)")
    check_divides(parser, "--accumulation", args.accumulation, defaults.batch_per_rank,
                  "the batch of sequences per rank")
    try:  # CapstoneConfig checks its own fields too; say what it found as argparse would
        world_size = world_size_in_use(args.world_size)[0]  # torchrun's, under torchrun
        return dataclasses.replace(defaults, world_size=world_size, steps=args.steps,
                                   checkpoint_step=args.checkpoint_step, out_dir=args.out_dir,
                                   seed=args.seed, accumulation=args.accumulation,
                                   lr_spike_step=args.lr_spike_step)
    except ValueError as error:
        parser.error(str(error))


def max_world_size(config: CapstoneConfig) -> int:
    """The most ranks `config`'s corpus can feed: a step takes batch_per_rank windows per rank."""
    return config.corpus_tokens // (config.gpt.context + 1) // config.batch_per_rank


def check_ranks_fit_corpus(parser: argparse.ArgumentParser, requested: int,
                           config: CapstoneConfig) -> None:
    """Exit with status 2 (argparse) when the run would have more ranks than the corpus feeds."""
    windows = config.corpus_tokens // (config.gpt.context + 1)
    check_world_size(parser, requested, max_world_size(config),
                     f"the corpus holds {windows} sequences and one step gives each rank "
                     f"{config.batch_per_rank}")


def main(argv: list[str] | None = None) -> int:
    """Train, print the report, write metrics.jsonl and loss.png; 0 if RESUME VERIFIED.

    RESUME VERIFIED means two checks held: the checkpoint reloads byte for byte, and a run
    resumed from it ends bitwise where the uninterrupted run ends (`train.compare_resumed`).
    """
    config = parse(argv)
    out = Path(config.out_dir)
    if launch.is_reporting_process():
        # A fresh run, not a resume. Under torchrun only global rank 0 deletes (the nodes share
        # the folder), before it joins the group; no rank gets past joining, so none saves or
        # rolls back, until every rank, this one included, has joined.
        shutil.rmtree(out / "checkpoints", ignore_errors=True)
    both = launch.run(run_and_resume, config, world_size=config.world_size)
    if not launch.is_reporting_process():
        return 0
    results = [rank_results["straight"] for rank_results in both]
    resumed = compare_resumed(results, [rank_results["resumed"] for rank_results in both])
    first = results[0]
    print(f"lesson 81 capstone: MiniGPT ({first['numel']} parameters) on {len(results)} ranks, "
          f"DDP broadcast + ZeRO-1 + sharded checkpoint after step {config.checkpoint_step}")
    print(loss_table(first["records"]))
    for event in first["events"]:
        print(f"divergence guard: {event['reason']}; rolled back to step {event['to_step']}"
              if event["event"] == "rollback" else f"divergence guard: {event['message']}")
    print(memory_table(results))
    folder = first["checkpoints"].get(config.checkpoint_step)
    if folder is not None:
        print(manifest_summary(folder))
    metrics = write_metrics(out / "metrics.jsonl", first["records"], first["events"])
    _plot(metrics, out / "loss.png")
    same_norms = all(r["records"][i]["param_norm"] == first["records"][i]["param_norm"]
                     for r in results for i in range(len(first["records"])))
    reloaded = bool(first["resume_verified"]) and all(all(r["resume_verified"].values()) for r in results)
    print(f"parameter norms identical on all ranks at every step: {same_norms}")
    print(f"metrics: {metrics}; loss curve: {out / 'loss.png'}")
    print(resume_report(config, len(results), reloaded, resumed))
    verified = reloaded and all(resumed.values())
    print("RESUME VERIFIED" if verified else "RESUME FAILED")
    return 0 if verified and same_norms else 1


def resume_report(config: CapstoneConfig, world_size: int, reloaded: bool,
                  resumed: dict[str, bool]) -> str:
    """What the resume check compared, one line each, with its verdict."""
    step = config.checkpoint_step
    lines = [f"resume check 1: step-{step} checkpoint reloaded into fresh objects equals the "
             f"in-memory copy taken at the save, byte for byte, on all {world_size} ranks: {reloaded}",
             f"resume check 2: resumed from step {step} and trained to step {config.steps}; bitwise "
             "equal to the uninterrupted run on every rank:"]
    lines += [f"  {name}: {same}" for name, same in resumed.items()]
    return "\n".join(lines)


def _plot(metrics: Path, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    from lesson_code.capstone.report import read_metrics
    from lesson_code.plots.capstone import loss_curve_figure
    loss_curve_figure(read_metrics(metrics)).savefig(path)
