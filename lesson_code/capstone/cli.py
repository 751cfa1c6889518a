"""Command line of the capstone (lesson 81): `python -m lesson_code.capstone [--world-size N] ...`.

`python -m lesson_code.capstone --help` lists the options; under torchrun, torchrun's WORLD_SIZE
is the run's world size. `--lang fa` prints the report in Persian; its last line is
RESUME VERIFIED (or RESUME FAILED) in either language, for scripts that look for it.
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
from lesson_code.capstone.report import (LANGUAGES, loss_table, manifest_summary, memory_table,
                                         number, reason_text, write_metrics)
from lesson_code.capstone.train import compare_resumed, run_and_resume


# What the command prints around the report's tables, in each language of `--lang`.
WORDS = {
    "en": {
        "title": "lesson 81 capstone: MiniGPT ({numel} parameters) on {n} ranks, "
                 "DDP broadcast + ZeRO-1 + sharded checkpoint after step {step}",
        "rollback": "divergence guard: {reason}; rolled back to step {to_step}",
        "skip": "divergence guard: step {step}'s batch skipped: still rejected after {retries} "
                "rollbacks ({reason})",
        "norms": "parameter norms identical on all ranks at every step: {same}",
        "metrics": "metrics: {metrics}; loss curve: {plot}",
        "check_1": "resume check 1: step-{step} checkpoint reloaded into fresh objects equals the "
                   "in-memory copy taken at the save, byte for byte, on all {n} ranks: {same}",
        "check_2": "resume check 2: resumed from step {step} and trained to step {steps}; bitwise "
                   "equal to the uninterrupted run on every rank:",
        "items": {},
    },
    "fa": {
        "title": "درس ۸۱، پروژهٔ پایانی: MiniGPT با {numel} پارامتر روی {n} رتبه؛ "
                 "بازپخش DDP، ZeRO-1 و چکپوینت شاردشده پس از گام {step}",
        "rollback": "محافظ واگرایی: {reason}؛ بازگشت به چکپوینت گام {to_step}",
        "skip": "محافظ واگرایی: دستهٔ گام {step} کنار گذاشته شد، چون پس از {retries} بار بازگشت "
                "به چکپوینت باز هم رد شد ({reason})",
        "norms": "نرم پارامترها در همهٔ رتبه‌ها و همهٔ گام‌ها یکسان است: {same}",
        "metrics": "معیارها: {metrics}؛ منحنی زیان: {plot}",
        "check_1": "وارسی ۱ ادامهٔ آموزش: چکپوینت گام {step}، بارگذاری‌شده در اشیای تازه، "
                   "بایت‌به‌بایت با رونوشتی برابر است که هنگام ذخیره از حافظه برداشته شد، "
                   "روی هر {n} رتبه: {same}",
        "check_2": "وارسی ۲ ادامهٔ آموزش: از گام {step} ادامه یافت و تا گام {steps} آموزش دید؛ "
                   "روی هر رتبه بیت‌به‌بیت برابر با اجرای بی‌وقفه:",
        "items": {"steps and losses": "گام‌ها و زیان‌ها", "params": "پارامترها",
                  "master": "وزن‌های اصلی fp32", "exp_avg": "گشتاور اول Adam",
                  "exp_avg_sq": "گشتاور دوم Adam", "optimizer_step": "شمارندهٔ گام Adam",
                  "rng_state": "وضعیت مولد اعداد تصادفی"},
    },
}


def parse(argv: list[str] | None) -> CapstoneConfig:
    """The run's settings from the command line; a bad argument exits with status 2 (argparse)."""
    return parse_arguments(argv)[0]


def parse_arguments(argv: list[str] | None) -> tuple[CapstoneConfig, str]:
    """The run's settings and the report's language ("en" or "fa"); exits 2 on a bad argument."""
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
    parser.add_argument("--lang", choices=LANGUAGES, default="en",
                        help="language of the report (default en)")
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
                                   lr_spike_step=args.lr_spike_step), args.lang
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
    config, lang = parse_arguments(argv)
    said, n = WORDS[lang], lambda value: number(value, lang)
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
    print(said["title"].format(numel=n(first["numel"]), n=n(len(results)),
                               step=n(config.checkpoint_step)))
    print(loss_table(first["records"], lang))
    for event in first["events"]:
        reason = reason_text(event["reason"], lang)
        print(said["rollback"].format(reason=reason, to_step=n(event["to_step"]))
              if event["event"] == "rollback" else
              said["skip"].format(step=n(event["step"]), retries=n(config.guard_retries), reason=reason))
    print(memory_table(results, lang))
    folder = first["checkpoints"].get(config.checkpoint_step)
    if folder is not None:
        print(manifest_summary(folder, lang))
    metrics = write_metrics(out / "metrics.jsonl", first["records"], first["events"])
    _plot(metrics, out / "loss.png", lang)
    same_norms = all(r["records"][i]["param_norm"] == first["records"][i]["param_norm"]
                     for r in results for i in range(len(first["records"])))
    reloaded = bool(first["resume_verified"]) and all(all(r["resume_verified"].values()) for r in results)
    print(said["norms"].format(same=same_norms))
    print(said["metrics"].format(metrics=metrics, plot=out / "loss.png"))
    print()  # the resume report, the last paragraph: `stdout.rsplit("\n\n", 1)[-1]` finds it
    print(resume_report(config, len(results), reloaded, resumed, lang))
    verified = reloaded and all(resumed.values())
    print("RESUME VERIFIED" if verified else "RESUME FAILED")
    return 0 if verified and same_norms else 1


def resume_report(config: CapstoneConfig, world_size: int, reloaded: bool,
                  resumed: dict[str, bool], lang: str = "en") -> str:
    """What the resume check compared, one line each, with its verdict (True or False)."""
    said, n = WORDS[lang], lambda value: number(value, lang)
    lines = [said["check_1"].format(step=n(config.checkpoint_step), n=n(world_size), same=reloaded),
             said["check_2"].format(step=n(config.checkpoint_step), steps=n(config.steps))]
    lines += [f"  {said['items'].get(name, name)}: {same}" for name, same in resumed.items()]
    return "\n".join(lines)


def _plot(metrics: Path, path: Path, lang: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    from lesson_code.capstone.report import read_metrics
    from lesson_code.plots.capstone import loss_curve_figure
    loss_curve_figure(read_metrics(metrics), lang=lang).savefig(path)
