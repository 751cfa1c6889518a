"""Command line of the capstone (lesson 81): `python -m lesson_code.capstone [--world-size N] ...`.

`python -m lesson_code.capstone --help` lists the options; under torchrun, torchrun's WORLD_SIZE
is the run's world size, and only global rank 0 prints (an argument error too, once). `--lang
fa` prints the report in Persian; its last line starts with RESUME VERIFIED (or RESUME FAILED) in
either language, for scripts that look for it, and says what was compared (`verdict_line`; in
Persian the line before it says that, so that it reads right to left).

A run that stops (a rank killed, a node lost) is continued by the same command with the same
--out-dir: by hand, or by torchrun's agent (`torchrun --max-restarts=2 ...`), which restarts the
group; the report's second line says where the run started (`capstone.resume`). `--fresh`
starts at step 0 instead. The checks train a second run (the steps after a checkpoint again for a
fresh one, the whole run from step 0 for a continued one); `--no-check` leaves them out, as a cluster's restarts need.
`--kill-at-step` is a crash for the lesson and the tests: one rank
kills itself with SIGKILL on the run's first attempt.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from lesson_code import launch
from lesson_code.capstone.config import CapstoneConfig
from lesson_code.capstone.report import (loss_table, manifest_summary, memory_table, reason_text,
                                         write_metrics, write_summary)
from lesson_code.capstone.resume import check_folder, start_or_continue, world_size_name
from lesson_code.capstone.train import all_events, all_records, compare_resumed
from lesson_code.checkpoint.tools import list_checkpoints
from lesson_code.harness.cli_args import (check_divides, check_in_range, non_negative_int,
                                          positive_int, seed_int, world_size_in_use)
from lesson_code.language import LANGUAGES, fill, listed, number, series


# What the command prints around the report's tables, in each language of `--lang`. A Persian
# verdict says what held on a line of its own, which starts with a Persian word and so reads right
# to left; its last line keeps RESUME VERIFIED (or RESUME FAILED) first, for scripts, and is short.
VERIFIED_FA = "ادامهٔ آموزش وارسی شد"
WORDS = {
    "en": {
        "title": "lesson 81 capstone: MiniGPT ({numel} parameters) on {n} ranks, "
                 "DDP broadcast + ZeRO-1 + sharded checkpoints after steps {steps}",
        "fresh": "started fresh at step 0: no checkpoint to continue from in {root}{why}",
        "fresh_flag": " (--fresh deleted the checkpoints there first)",
        "resumed": "resumed from step {step}: {folder}, the newest checkpoint that verifies{why}",
        "fresh_ignored": " (--fresh starts a run on its first attempt only: a restart continues it)",
        "finished": " (the run had finished: nothing left to train; a larger --steps trains on, "
                    "--fresh starts again)",
        "shared_store": "warning: torchrun restarts the ranks of several nodes here "
                        "(--max-restarts), but its agents share one store across attempts and "
                        "count restarts apart, so a restarted group waits for the timeout and "
                        "fails (pytorch/pytorch#135712): set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "
                        "in torchrun's environment on every node",
        "restarts": "; torchrun has restarted the ranks {n} time(s) (TORCHELASTIC_RESTART_COUNT)",
        "skipped": "  skipped {reason}",
        "rollback": "divergence guard: {reason}; rolled back to step {to_step}",
        "skip": "divergence guard: step {step}'s batch skipped: still rejected after {retries} "
                "rollbacks ({reason})",
        "norms": "parameter norms identical on all ranks at every step: {same}",
        "metrics": "metrics: {metrics}; loss curve: {plot}",
        "check_1": "resume check 1: {steps} checkpoint(s) reloaded into fresh objects equal the "
                   "in-memory copies taken at the saves, byte for byte, on all {n} ranks: {same}",
        "check_2": "resume check 2: resumed from step {step} and trained to step {steps}; bitwise "
                   "equal to the uninterrupted run on every rank:",
        "check_1_continued": "resume check 1: the step-{step} checkpoint this run continued from "
                             "holds, tensor for tensor, what an uninterrupted run started here "
                             "saved after step {step}, and every checkpoint of both reloads byte "
                             "for byte, on all {n} ranks: {same}",
        "check_2_continued": "resume check 2: continued from step {step} to step {steps}; bitwise "
                             "equal, on every rank, to that uninterrupted run:",
        "verified": "RESUME VERIFIED: a run resumed from the step-{step} checkpoint matched this "
                    "run bit for bit on all {n} ranks: the same losses in steps {first} to {steps} "
                    "and, after step {steps}, the same parameters, optimizer state and RNG state; "
                    "the checkpoints of steps {saved} reload byte for byte",
        "verified_continued": "RESUME VERIFIED: this run, continued from the step-{step} "
                              "checkpoint, matched a run from step 0 that never stopped bit for bit "
                              "on all {n} ranks: the same losses in steps 1 to {steps} and, after "
                              "step {steps}, the same parameters, optimizer state and RNG state; "
                              "the step-{step} checkpoint holds what that run saved after step "
                              "{step}, and every checkpoint reloads byte for byte",
        "failed": "RESUME FAILED: {what}",
        "not_checked": "resume check not run (--no-check): no second run was trained and nothing "
                       "was compared with one; the checkpoints of steps {saved} reload byte for "
                       "byte on all {n} ranks: {same}",
        "unchecked": "RESUME NOT CHECKED (--no-check): the run trained to step {steps} on {n} ranks, "
                     "no run from another start was compared with it",
        "differ": "not equal bit for bit: {items}",
        "not_reloaded": "a checkpoint does not reload byte for byte",
        "died": "{error}\nthe checkpoints in {root} are kept: run the same command again to "
                "continue from the newest one that verifies",
        "items": {},
    },
    "fa": {
        "title": "درس ۸۱، پروژهٔ پایانی: MiniGPT با {numel} پارامتر روی {n} رتبه؛ "
                 "بازپخش DDP، ZeRO-1 و چکپوینت‌های شاردشده پس از گام‌های {steps}",
        "fresh": "اجرا از گام ۰ آغاز شد: در {root} چکپوینتی برای ادامه نبود{why}",
        "fresh_flag": " (--fresh پیش از آغاز چکپوینت‌های آنجا را پاک کرد)",
        "resumed": "اجرا از گام {step} ادامه یافت: {folder}، تازه‌ترین چکپوینتی که وارسی‌اش درست "
                   "درآمد{why}",
        "fresh_ignored": " (--fresh فقط در نخستین تلاش اجرای تازه‌ای آغاز می‌کند؛ راه‌اندازی "
                         "دوباره اجرا را ادامه می‌دهد)",
        "finished": " (اجرا پیش‌تر به پایان رسیده بود و گامی برای آموزش نمانده است؛ با --steps "
                    "بزرگ‌تر آموزش ادامه می‌یابد و با --fresh از نو آغاز می‌شود)",
        "shared_store": "هشدار: torchrun در اینجا رتبه‌های چند گره را دوباره راه می‌اندازد "
                        "(--max-restarts)، اما عامل‌هایش یک انبارهٔ کلید را میان تلاش‌ها نگه می‌دارند "
                        "و هر کدام شمار راه‌اندازی‌ها را جدا می‌شمارد؛ پس گروه راه‌اندازی‌شده تا پایان "
                        "مهلت می‌ماند و شکست می‌خورد (pytorch/pytorch#135712): در محیط torchrun روی "
                        "هر گره TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 را تنظیم کنید",
        "restarts": "؛ torchrun رتبه‌ها را {n} بار دوباره راه انداخته است "
                    "(TORCHELASTIC_RESTART_COUNT)",
        "skipped": "  کنار گذاشته شد: {reason}",
        "rollback": "محافظ واگرایی: {reason}؛ بازگشت به چکپوینت گام {to_step}",
        "skip": "محافظ واگرایی: دستهٔ گام {step} کنار گذاشته شد، چون پس از {retries} بار بازگشت "
                "به چکپوینت باز هم رد شد ({reason})",
        "norms": "نُرم پارامترها در همهٔ رتبه‌ها و همهٔ گام‌ها یکسان است: {same}",
        "metrics": "معیارها: {metrics}؛ منحنی زیان: {plot}",
        "check_1": "وارسی نخستِ ادامهٔ آموزش: چکپوینت‌های {steps}، بارگذاری‌شده در اشیای تازه، "
                   "بایت‌به‌بایت با رونوشت‌هایی برابرند که هنگام ذخیره از حافظه برداشته شده بودند، "
                   "روی هر {n} رتبه: {same}",
        "check_2": "وارسی دومِ ادامهٔ آموزش: اجرایی که از گام {step} ادامه یافت و تا گام {steps} "
                   "پیش رفت، روی هر رتبه در این قلم‌ها بیت‌به‌بیت با اجرای بی‌وقفه برابر است:",
        "check_1_continued": "وارسی نخستِ ادامهٔ آموزش: چکپوینت گام {step}، که این اجرا از آن "
                             "ادامه یافت، تنسور به تنسور همان است که اجرایی بی‌وقفه از گام ۰ پس از "
                             "گام {step} ذخیره کرد، و هر چکپوینت هر دو اجرا بایت‌به‌بایت بازیابی می‌شود، "
                             "روی هر {n} رتبه: {same}",
        "check_2_continued": "وارسی دومِ ادامهٔ آموزش: این اجرا، که از گام {step} تا گام {steps} "
                             "ادامه یافت، روی هر رتبه در این قلم‌ها بیت‌به‌بیت با همان اجرای "
                             "بی‌وقفه برابر است:",
        "verified": "اجرایی که از چکپوینت گام {step} ادامه یافت، روی هر {n} رتبه "
                    "بیت‌به‌بیت با همین اجرا برابر بود: همان زیان‌ها در گام‌های {first} تا {steps}، "
                    "و پس از گام {steps} همان پارامترها، وضعیت بهینه‌ساز و وضعیت مولد اعداد "
                    "تصادفی؛ چکپوینت‌های گام‌های {saved} نیز بایت‌به‌بایت بازیابی می‌شوند."
                    "\nRESUME VERIFIED: " + VERIFIED_FA,
        "verified_continued": "این اجرا، که از چکپوینت گام {step} ادامه یافت، "
                              "روی هر {n} رتبه بیت‌به‌بیت با اجرای بی‌وقفه‌ای از گام ۰ برابر بود: "
                              "همان زیان‌ها در گام‌های ۱ تا {steps}، و پس از گام {steps} همان "
                              "پارامترها، وضعیت بهینه‌ساز و وضعیت مولد اعداد تصادفی؛ چکپوینت گام "
                              "{step} همان را دارد که آن اجرا پس از گام {step} ذخیره کرد، و هر "
                              "چکپوینت بایت‌به‌بایت بازیابی می‌شود.\nRESUME VERIFIED: " + VERIFIED_FA,
        "failed": "{what}\nRESUME FAILED: ادامهٔ آموزش وارسی شد و درست نبود",
        "not_checked": "وارسی ادامهٔ آموزش اجرا نشد (--no-check): اجرای دومی آموزش ندید و چیزی با "
                       "آن مقایسه نشد؛ چکپوینت‌های گام‌های {saved} روی هر {n} رتبه بایت‌به‌بایت "
                       "بازیابی می‌شوند: {same}",
        "unchecked": "RESUME NOT CHECKED (--no-check): اجرا روی {n} رتبه تا گام {steps} آموزش دید و "
                     "اجرایی از آغازی دیگر با آن مقایسه نشد",
        "differ": "بیت‌به‌بیت برابر نبود: {items}",
        "not_reloaded": "چکپوینتی بایت‌به‌بایت بازیابی نمی‌شود",
        "died": "{error}\nچکپوینت‌های {root} سر جایشان هستند: همین فرمان را دوباره اجرا کنید تا "
                "از تازه‌ترین چکپوینتی که وارسی‌اش درست درآید ادامه دهد",
        "items": {"steps and losses": "گام‌ها و زیان‌ها", "params": "پارامترها",
                  "master": "وزن‌های اصلی fp32", "exp_avg": "گشتاور اول Adam",
                  "exp_avg_sq": "گشتاور دوم Adam", "optimizer_step": "شمارندهٔ گام Adam",
                  "rng_state": "وضعیت مولد اعداد تصادفی"},
    },
}


class CommandParser(argparse.ArgumentParser):
    """argparse, except that under torchrun only global rank 0 prints (usage, --help, an error):
    every process of the run parses the same arguments and exits alike, and one copy is enough."""

    def _print_message(self, message: str, file=None) -> None:
        if launch.is_reporting_process():
            super()._print_message(message, file)


def parse(argv: list[str] | None) -> CapstoneConfig:
    """The run's settings from the command line; a bad argument exits with status 2 (argparse)."""
    return parse_arguments(argv)[0]


def parse_arguments(argv: list[str] | None) -> tuple[CapstoneConfig, str, bool, bool]:
    """The run's settings, the report's language ("en" or "fa"), whether --fresh was given and
    whether the resume checks run (not with --no-check).

    Exits with status 2 on a bad argument, and, without --fresh, when --out-dir holds
    checkpoints of another run (`resume.check_folder`), before any rank starts.
    """
    defaults = CapstoneConfig()
    parser = CommandParser(prog="python -m lesson_code.capstone",
                           description="MiniGPT on N ranks: DDP + ZeRO-1 + sharded checkpoints. "
                                       "Run again with the same --out-dir, it continues the run "
                                       "from its newest checkpoint that verifies.")
    parser.add_argument("--world-size", type=positive_int, default=defaults.world_size,
                        help="ranks to spawn (under torchrun, torchrun decides)")
    parser.add_argument("--steps", type=positive_int, default=defaults.steps)
    parser.add_argument("--checkpoint-step", type=positive_int, default=defaults.checkpoint_step,
                        help="save a sharded checkpoint after this step (1..steps); the resume "
                             "check reloads it. One is also saved after the last step")
    parser.add_argument("--checkpoint-every", type=positive_int, default=None, metavar="STEPS",
                        help="also save after every multiple of STEPS (a run that dies loses less)")
    parser.add_argument("--out-dir", default=defaults.out_dir,
                        help="metrics, plot and checkpoints; a run there is continued")
    parser.add_argument("--fresh", action="store_true",
                        help="delete the checkpoints in --out-dir and start at step 0 (on the "
                             "first attempt only: a torchrun restart continues the run)")
    parser.add_argument("--no-check", action="store_true",
                        help="train the run alone, without the resume checks: by default a fresh "
                             "run is replayed from a checkpoint (its last steps again) and a continued "
                             "run is compared with a run from step 0 (a whole run more, at every "
                             "restart); on a cluster, pass it")
    parser.add_argument("--seed", type=seed_int, default=defaults.seed)
    parser.add_argument("--accumulation", type=positive_int, default=defaults.accumulation,
                        help=f"micro-batches per step, a divisor of the batch per rank "
                             f"({defaults.batch_per_rank})")
    parser.add_argument("--lr-spike-step", type=positive_int, default=None,
                        help="inject a learning-rate spike at this step (tests the divergence guard)")
    parser.add_argument("--kill-at-step", type=positive_int, default=None,
                        help="a crash, to see the run continue: one rank kills itself (SIGKILL) "
                             "after this step, only in a run that starts at step 0 on torchrun's "
                             "first attempt (for teaching and testing)")
    parser.add_argument("--kill-rank", type=non_negative_int, default=None,
                        help="the rank --kill-at-step kills (default: the last)")
    parser.add_argument("--kill-during-save", action="store_true",
                        help="kill half-way through writing the checkpoint of --kill-at-step "
                             "(a save step) instead of after it")
    parser.add_argument("--lang", choices=LANGUAGES, default="en",
                        help="language of the report (default en)")
    args = parser.parse_args(argv)
    check_in_range(parser, "--checkpoint-step", args.checkpoint_step, 1, args.steps,
                   f"the checkpoint is saved after one of the run's {args.steps} steps (--steps)")
    for flag, value in (("--lr-spike-step", args.lr_spike_step), ("--kill-at-step", args.kill_at_step)):
        if value is not None:
            check_in_range(parser, flag, value, 1, args.steps,
                           f"it happens at one of the run's {args.steps} steps (--steps)")
    check_divides(parser, "--accumulation", args.accumulation, defaults.batch_per_rank,
                  "the batch of sequences per rank")
    world_size = world_size_in_use(args.world_size)[0]  # torchrun's, under torchrun
    try:  # CapstoneConfig checks its own fields too; say what it found as argparse would
        config = dataclasses.replace(
            defaults, world_size=world_size, steps=args.steps, checkpoint_step=args.checkpoint_step,
            checkpoint_every=args.checkpoint_every, out_dir=args.out_dir, seed=args.seed,
            accumulation=args.accumulation, lr_spike_step=args.lr_spike_step)
    except ValueError as error:
        parser.error(str(error))
    config = _with_kill(parser, config, args)
    if not args.fresh:
        try:
            check_folder(config)
        except ValueError as error:
            parser.error(str(error))
    return config, args.lang, args.fresh, not args.no_check


def _with_kill(parser: argparse.ArgumentParser, config: CapstoneConfig,
               args: argparse.Namespace) -> CapstoneConfig:
    """`config` with the crash of --kill-at-step, --kill-rank and --kill-during-save, checked."""
    if args.kill_at_step is None:
        if args.kill_rank is not None or args.kill_during_save:
            parser.error("--kill-rank and --kill-during-save need --kill-at-step: pass the step "
                         "after which (or during whose save) the rank is killed")
        return config
    if args.kill_rank is not None:
        check_in_range(parser, "--kill-rank", args.kill_rank, 0, config.world_size - 1,
                       f"the run has {config.world_size} ranks ({world_size_name()})")
    saves = sorted(config.save_steps())
    if args.kill_during_save and args.kill_at_step not in saves:
        parser.error(f"--kill-during-save: no checkpoint is saved after step {args.kill_at_step}, "
                     f"so pass --kill-at-step one of the save steps {', '.join(map(str, saves))}")
    return dataclasses.replace(config, kill_at_step=args.kill_at_step, kill_rank=args.kill_rank,
                               kill_during_save=args.kill_during_save)


def main(argv: list[str] | None = None) -> int:
    """Train (or continue the run in --out-dir), print the report, write metrics.jsonl, loss.png
    and run.json (where the run started and what the checks found); 0 if RESUME VERIFIED, or,
    with --no-check, if every checkpoint reloads and the norms agree (`unchecked_report`).

    RESUME VERIFIED means two checks held: every checkpoint reloads byte for byte (for a
    continued run: the one it continued from equals an uninterrupted run's), and a run from a
    checkpoint ends bitwise where a run from step 0 ends (`train.compare_resumed`); the line
    says which runs, which steps and what state (`verdict_line`).
    """
    config, lang, fresh, check = parse_arguments(argv)
    said, n = WORDS[lang], lambda value: number(value, lang)
    out = Path(config.out_dir)
    if launch.is_reporting_process() and restarts_share_a_store():
        print(said["shared_store"], file=sys.stderr, flush=True)
    try:
        outcome = launch.run(start_or_continue, config, fresh, check, world_size=config.world_size,
                             timeout_s=launch.DEFAULT_TIMEOUT_S + 2 * config.steps)
    except launch.SpawnError as error:  # spawned ranks; torchrun's agent reports its own workers
        kept = list_checkpoints(out / "checkpoints")
        print(said["died"].format(error=error, root=out / "checkpoints") if kept else error,
              file=sys.stderr)
        return 1
    if not launch.is_reporting_process():
        return 0
    started = outcome[0]["started"]
    continued = started["from_step"] is not None
    if not check:
        results = [rank_results["run"] for rank_results in outcome]
    else:
        straight = [rank_results["straight"] for rank_results in outcome]
        resumed = [rank_results["resumed"] for rank_results in outcome]
        results = resumed if continued else straight  # the run of record; the other checks it
    first = results[0]
    print(said["title"].format(numel=n(first["numel"]), n=n(len(results)),
                               steps=series(map(n, sorted(config.save_steps())), lang)))
    print(start_line(started, out / "checkpoints", fresh, config.steps, lang))
    records, events = all_records(first), all_events(first)
    print(loss_table(records, lang))
    for event in events:
        reason = reason_text(event["reason"], lang)
        print(said["rollback"].format(reason=reason, to_step=n(event["to_step"]))
              if event["event"] == "rollback" else
              said["skip"].format(step=n(event["step"]), retries=n(config.guard_retries), reason=reason))
    print(memory_table(results, lang))
    kept = first["checkpoints"]
    if kept:
        print(manifest_summary(kept.get(config.checkpoint_step) or kept[max(kept)], lang))
    metrics = write_metrics(out / "metrics.jsonl", records, events)
    _plot(metrics, out / "loss.png", lang)
    same_norms = all(r["records"][i]["param_norm"] == first["records"][i]["param_norm"]
                     for r in results for i in range(len(first["records"])))
    print(fill(said["norms"], lang, same=same_norms))  # in Persian, True is بله
    print(said["metrics"].format(metrics=metrics, plot=out / "loss.png"))
    print()  # the resume report, the last paragraph: `stdout.rsplit("\n\n", 1)[-1]` finds it
    if not check:
        return unchecked_report(config, results, started, same_norms, out / "run.json", lang)
    verified = [r["resume_verified"] for r in straight + (resumed if continued else [])]
    reloaded = all(all(v.values()) for v in verified) and bool(straight[0]["resume_verified"])
    if continued:
        reloaded = reloaded and outcome[0]["same_start"]
    compared = compare_resumed(straight, resumed)
    from_step = started["from_step"] if continued else resumed_from(resumed[0])
    print(resume_report(config, len(results), reloaded, compared, lang, from_step, continued,
                        sorted(straight[0]["resume_verified"])))
    verified = reloaded and all(compared.values())
    write_summary(out / "run.json", {"started": started, "steps": config.steps,
                                     "world_size": len(results), "reloaded": reloaded,
                                     "compared": compared, "verified": verified})
    print(verdict_line(config, len(results), reloaded, compared, lang, from_step, continued,
                       sorted(straight[0]["resume_verified"])))
    return 0 if verified and same_norms else 1


def unchecked_report(config: CapstoneConfig, results: list[dict], started: dict, same_norms: bool,
                     summary: Path, lang: str) -> int:
    """The last paragraph of a run with --no-check: which of its checkpoints reload byte for byte
    (checked at each save, no second run needed), then RESUME NOT CHECKED; writes run.json with
    "checked": false. The exit status: 0 if those checkpoints reload and the norms agree."""
    said, n = WORDS[lang], lambda value: number(value, lang)
    saved = sorted(results[0]["resume_verified"])
    reloaded = all(all(r["resume_verified"].values()) for r in results)
    print(fill(said["not_checked"], lang, saved=series(map(n, saved), lang) if saved else "-",
               n=n(len(results)), same=reloaded))
    write_summary(summary, {"started": started, "steps": config.steps, "world_size": len(results),
                            "reloaded": reloaded, "checked": False, "verified": None})
    print(said["unchecked"].format(steps=n(config.steps), n=n(len(results))))
    return 0 if reloaded and same_norms else 1


def restarts_share_a_store() -> bool:
    """Does torchrun restart ranks of several nodes (GROUP_WORLD_SIZE) whose agents share one
    store across attempts? Such a restart hangs until the timeout (see `launch.attempt_prefix`)."""
    return (launch.under_torchrun() and int(os.environ.get("GROUP_WORLD_SIZE", "1")) > 1
            and int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0
            and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True))


def resumed_from(result: dict) -> int:
    """The step a `run_rank` result resumed from: the last step of its history (0 if none)."""
    history = result["history"]["records"]
    return history[-1]["step"] if history else 0


def start_line(started: dict, root: Path, fresh: bool, steps: int, lang: str = "en") -> str:
    """Where the run of `steps` steps started: at step 0, or from which checkpoint, and after
    how many restarts; then one line per newer checkpoint skipped, with the reason."""
    said, n = WORDS[lang], lambda value: number(value, lang)
    restarts = said["restarts"].format(n=n(started["restarts"])) if started["restarts"] else ""
    if started["from_step"] is None:
        why = (said["fresh_flag"] if fresh and not started["restarts"] else "") + restarts
        line = said["fresh"].format(root=root, why=why)
    else:
        why = (said["fresh_ignored"] if fresh else "") + restarts
        why += said["finished"] if started["from_step"] >= steps else ""
        line = said["resumed"].format(step=n(started["from_step"]), folder=started["folder"], why=why)
    return "\n".join([line, *(said["skipped"].format(reason=r) for r in started["skipped"])])


def resume_report(config: CapstoneConfig, world_size: int, reloaded: bool,
                  resumed: dict[str, bool], lang: str = "en", from_step: int | None = None,
                  continued: bool = False, saved: list[int] | None = None) -> str:
    """What the resume checks compared, one line each, with its verdict (True or False; in
    Persian بله or خیر).

    `from_step` is where the checked run resumed (default `config.checkpoint_step`); `continued`
    says whether it is this run, continued after a stop, or a replay of a fresh run; `saved`
    lists the steps whose checkpoints were reloaded (default the checkpoint step).
    """
    said, n = WORDS[lang], lambda value: number(value, lang)
    step = config.checkpoint_step if from_step is None else from_step
    if continued:
        lines = [fill(said["check_1_continued"], lang, step=n(step), n=n(world_size), same=reloaded),
                 said["check_2_continued"].format(step=n(step), steps=n(config.steps))]
    else:
        steps = series((f"step-{n(s)}" if lang == "en" else f"گام {n(s)}"
                        for s in (saved or [config.checkpoint_step])), lang)
        lines = [fill(said["check_1"], lang, steps=steps, n=n(world_size), same=reloaded),
                 said["check_2"].format(step=n(step), steps=n(config.steps))]
    lines += [fill("  {name}: {same}", lang, name=said["items"].get(name, name), same=same)
              for name, same in resumed.items()]
    return "\n".join(lines)


def verdict_line(config: CapstoneConfig, world_size: int, reloaded: bool,
                 compared: dict[str, bool], lang: str = "en", from_step: int | None = None,
                 continued: bool = False, saved: list[int] | None = None) -> str:
    """The report's last line: RESUME VERIFIED (or RESUME FAILED), then what exactly held (in
    Persian on a line of its own before it, which starts with a Persian word).

    RESUME VERIFIED only when `reloaded` (every checkpoint reloads byte for byte) and every
    verdict of `compared` (`train.compare_resumed`) is True; it then says which run was compared
    with which, from which step, and which steps' losses and what state were equal. RESUME FAILED
    names what was not equal. The arguments are `resume_report`'s.
    """
    said, n = WORDS[lang], lambda value: number(value, lang)
    step = config.checkpoint_step if from_step is None else from_step
    if reloaded and all(compared.values()):
        return said["verified_continued" if continued else "verified"].format(
            step=n(step), n=n(world_size), first=n(step + 1), steps=n(config.steps),
            saved=series(map(n, saved or [config.checkpoint_step]), lang))
    what = [] if reloaded else [said["not_reloaded"]]
    differing = [said["items"].get(name, name) for name, same in compared.items() if not same]
    if differing:
        what.append(said["differ"].format(items=listed(differing, lang)))
    return said["failed"].format(what=("; " if lang == "en" else "؛ ").join(what))


def _plot(metrics: Path, path: Path, lang: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    from lesson_code.capstone.report import read_metrics
    from lesson_code.plots.capstone import loss_curve_figure
    loss_curve_figure(read_metrics(metrics), lang=lang).savefig(path)
