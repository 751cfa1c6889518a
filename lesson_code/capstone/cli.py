"""Command line of the capstone: `python -m lesson_code.capstone [--world-size N] [--steps S] ...`."""

from __future__ import annotations

import argparse
import dataclasses
import shutil
from pathlib import Path

from lesson_code import launch
from lesson_code.capstone.config import CapstoneConfig
from lesson_code.capstone.report import loss_table, manifest_summary, memory_table, write_metrics
from lesson_code.capstone.train import run_rank


def parse(argv: list[str] | None) -> CapstoneConfig:
    defaults = CapstoneConfig()
    parser = argparse.ArgumentParser(prog="python -m lesson_code.capstone",
                                     description="MiniGPT on N ranks: DDP + ZeRO-1 + sharded checkpoint")
    parser.add_argument("--world-size", type=int, default=defaults.world_size,
                        help="ranks to spawn (under torchrun, torchrun decides)")
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--checkpoint-step", type=int, default=defaults.checkpoint_step)
    parser.add_argument("--out-dir", default=defaults.out_dir, help="metrics, plot and checkpoints")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--accumulation", type=int, default=defaults.accumulation)
    parser.add_argument("--lr-spike-step", type=int, default=None,
                        help="inject a learning-rate spike at this step (tests the divergence guard)")
    args = parser.parse_args(argv)
    return dataclasses.replace(defaults, world_size=args.world_size, steps=args.steps,
                               checkpoint_step=args.checkpoint_step, out_dir=args.out_dir,
                               seed=args.seed, accumulation=args.accumulation,
                               lr_spike_step=args.lr_spike_step)


def main(argv: list[str] | None = None) -> int:
    """Train, print the report, write metrics.jsonl and loss.png; 0 if RESUME VERIFIED."""
    config = parse(argv)
    out = Path(config.out_dir)
    if launch.is_reporting_process():
        # A fresh run, not a resume. Under torchrun only global rank 0 deletes (the nodes share
        # the folder), before it joins the group; no rank gets past joining, so none saves or
        # rolls back, until every rank, this one included, has joined.
        shutil.rmtree(out / "checkpoints", ignore_errors=True)
    results = launch.run(run_rank, config, world_size=config.world_size)
    if not launch.is_reporting_process():
        return 0
    first = results[0]
    print(f"lesson 81 capstone: MiniGPT ({first['numel']} parameters) on {len(results)} ranks, "
          f"DDP broadcast + ZeRO-1 + sharded checkpoint after step {config.checkpoint_step}")
    print(loss_table(first["records"]))
    for event in first["events"]:
        print(f"divergence guard: {event['reason']}; rolled back to step {event['to_step']}")
    print(memory_table(results))
    folder = first["checkpoints"].get(config.checkpoint_step)
    if folder is not None:
        print(manifest_summary(folder))
    metrics = write_metrics(out / "metrics.jsonl", first["records"], first["events"])
    _plot(metrics, out / "loss.png")
    same_norms = all(r["records"][i]["param_norm"] == first["records"][i]["param_norm"]
                     for r in results for i in range(len(first["records"])))
    verified = bool(first["resume_verified"]) and all(all(r["resume_verified"].values()) for r in results)
    print(f"parameter norms identical on all ranks at every step: {same_norms}")
    print(f"metrics: {metrics}; loss curve: {out / 'loss.png'}")
    print("RESUME VERIFIED" if verified else "RESUME FAILED")
    return 0 if verified and same_norms else 1


def _plot(metrics: Path, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    from lesson_code.capstone.report import read_metrics
    from lesson_code.plots.capstone import loss_curve_figure
    loss_curve_figure(read_metrics(metrics)).savefig(path)
