"""Each lesson's core correctness check, on what this machine has: one line per check (76-81).

On a laptop the ranks are CPU processes talking over gloo; on a machine with a GPU per rank they
are GPUs talking over NCCL (`launch` chooses; `--backend` forces one). Each check compares a
lesson's code with PyTorch's own implementation or with one process on the whole batch, with the
tolerance its tests use, so a pass here means the lesson's claims hold on this machine.

    python -m lesson_code.selfcheck                  # 4 ranks (one per GPU where there are 2 or more)
    python -m lesson_code.selfcheck --backend gloo   # the CPU path, even on a GPU machine
    python -m lesson_code.selfcheck --lang fa        # the lines in Persian
    make selfcheck                                   # make selfcheck LANG=fa: in Persian
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from typing import Callable

import torch
import torch.distributed as dist

from lesson_code import collectives_lab, ddp_lab, language, launch, pipeline_lab, zero_lab
from lesson_code.capstone import CapstoneConfig, run_rank
from lesson_code.checkpoint_lab import round_trip
from lesson_code.harness.cli_args import add_language, positive_int
from lesson_code.runtime.devices import current_device


def collectives_within_bound(rank: int, world_size: int) -> dict:
    """Lesson 76: every primitive and every algorithm `auto` may choose against torch.distributed's,
    float32 and int64 tensors."""
    results = [compare(rank, world_size, 1001, dtype)
               for compare in (collectives_lab.compare_with_builtin,
                               collectives_lab.compare_every_algorithm)
               for dtype in ("float32", "int64")]
    worst = max(op["max_abs_diff"] for result in results for op in result.values())
    checked = len(results[0]) + len(results[2])  # per dtype: primitives, then algorithms
    return {"ok": all(op["within"] for result in results for op in result.values()),
            "facts": {"checked": checked, "worst": worst}}


def ddp_matches_one_process(rank: int, world_size: int) -> dict:
    """Lesson 77: bucketed DDP (SGD, MLP, 5 steps) against one process on the whole batch."""
    row = ddp_lab.compare_all_on_rank(rank, world_size, [ddp_lab.DDPRun(steps=5)])[0]
    return {"ok": row["ranks_identical"] and row["max_param_diff"] < 1e-6,
            "facts": {"identical": row["ranks_identical"], "diff": row["max_param_diff"]}}


def zero_matches_adam(rank: int, world_size: int) -> dict:
    """Lesson 78: ZeRO-1 (MLP, 5 steps) against torch.optim.Adam on one process."""
    run = zero_lab.ZeroRun(steps=5)
    result = zero_lab.train_on_rank(rank, world_size, run)
    reference = zero_lab.train_single_process(run)
    diff = (result["params"] - reference["params"]).abs().max().item()
    identical = _all_ranks(result["digests"][-1])
    return {"ok": identical and diff < 1e-5, "facts": {"identical": identical, "diff": diff}}


def zero3_matches_fsdp2_and_adam(rank: int, world_size: int) -> dict:
    """Lesson 78: ZeRO-3 (MLP, 5 steps) against torch's FSDP2 and one-process torch.optim.Adam."""
    run = zero_lab.ZeroRun(steps=5, optimizer="zero3")
    result = zero_lab.train_on_rank(rank, world_size, run)
    fsdp2 = zero_lab.train_on_rank(rank, world_size, replace(run, optimizer="fsdp2"))
    reference = zero_lab.train_single_process(run)
    to_adam = (result["params"] - reference["params"]).abs().max().item()
    to_fsdp2 = (result["params"] - fsdp2["params"]).abs().max().item()
    identical = _all_ranks(result["digests"][-1])
    return {"ok": identical and max(to_adam, to_fsdp2) < 1e-5,
            "facts": {"identical": identical, "to_fsdp2": to_fsdp2, "to_adam": to_adam}}


def pipeline_matches_unsplit(rank: int, world_size: int) -> dict:
    """Lesson 79: one 1F1B step (4 micro-batches) against the unsplit model's gradients."""
    run = pipeline_lab.PipeRun()
    stage = pipeline_lab.pipeline_step(rank, world_size, run)
    reference = pipeline_lab.reference_step(run)["grads"]
    local = max((grad - reference[name]).abs().max().item() for name, grad in stage["grads"].items())
    worst = torch.tensor([local], device=current_device())
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return {"ok": worst.item() < 1e-6, "facts": {"diff": worst.item()}}


def checkpoint_round_trip(rank: int, world_size: int) -> dict:
    """Lesson 80: save a ZeRO run's shards, load them into fresh objects, compare every byte."""
    with tempfile.TemporaryDirectory(prefix="selfcheck-") as root:
        folder = _same_on_all_ranks(root)
        equal = round_trip(rank, world_size, zero_lab.ZeroRun(steps=3), folder)
        dist.barrier()  # nobody deletes the folder while another rank still reads it
    ok = _all_ranks(all(equal.values()))
    return {"ok": ok, "facts": {"ok": ok}}


def capstone_resumes(rank: int, world_size: int) -> dict:
    """Lesson 81: the composed run (20 steps); the loss falls and the checkpoint restores exactly."""
    with tempfile.TemporaryDirectory(prefix="selfcheck-") as root:
        config = CapstoneConfig(out_dir=_same_on_all_ranks(root), world_size=world_size)
        result = run_rank(rank, world_size, config)
        dist.barrier()
    losses = [row["loss"] for row in result["records"]]
    verified = _all_ranks(all(result["resume_verified"].values()))
    return {"ok": verified and losses[-1] < losses[0] - 1.0,
            "facts": {"first": losses[0], "last": losses[-1], "verified": verified}}


# What each check's line says after its verdict, from the facts it returned, in each language.
DETAILS = {
    "collectives": ("{checked} primitives and algorithms x 2 dtypes within the summation bound, "
                    "max |diff| {worst:.1e}",
                    "{checked} عملیات و الگوریتم × ۲ نوع داده در کران خطای جمع، بیشینهٔ |اختلاف| "
                    "{worst:.1e}"),
    "data parallel": ("ranks identical {identical}, max |param - one process| {diff:.1e} (< 1e-6)",
                      "رتبه‌ها یکسان: {identical}، بیشینهٔ |پارامتر − یک فرایند| {diff:.1e} "
                      "(کمتر از ⁦۱۰⁻⁶⁩)"),
    "ZeRO-1": ("ranks identical {identical}, max |param - torch Adam| {diff:.1e} (< 1e-5)",
               "رتبه‌ها یکسان: {identical}، بیشینهٔ |پارامتر − Adam در torch| {diff:.1e} "
               "(کمتر از ⁦۱۰⁻⁵⁩)"),
    "ZeRO-3": ("ranks identical {identical}, max |param - FSDP2| {to_fsdp2:.1e}, - torch Adam "
               "{to_adam:.1e} (< 1e-5)",
               "رتبه‌ها یکسان: {identical}، بیشینهٔ |پارامتر − FSDP2| {to_fsdp2:.1e} و "
               "|پارامتر − Adam در torch| {to_adam:.1e} (کمتر از ⁦۱۰⁻⁵⁩)"),
    "pipeline": ("max |grad - unsplit model| {diff:.1e} over all stages (< 1e-6)",
                 "بیشینهٔ |گرادیان − مدل تقسیم‌نشده| در همهٔ مرحله‌ها {diff:.1e} (کمتر از ⁦۱۰⁻⁶⁩)"),
    "checkpoints": ("parameters, master, moments, RNG and step restored bit for bit: {ok}",
                    "پارامترها، وزن‌های اصلی، گشتاورها، وضعیت مولد تصادفی و گام بیت‌به‌بیت "
                    "بازگشتند: {ok}"),
    "capstone": ("loss {first:.3f} -> {last:.3f}, resume verified {verified}",
                 "زیان از {first:.3f} به {last:.3f}، ادامهٔ آموزش وارسی شد: {verified}"),
}
LINE = ("lesson {lesson} {name:14s} {verdict}  {backend} x{ranks} on {device:6s}  {detail}  "
        "({seconds:.1f} s)",
        "درس {lesson} {name} {verdict}  {backend} ×{ranks} روی {device}  {detail}  ({seconds:.1f} "
        "ثانیه)")
VERDICTS = {"en": ("PASS", "FAIL"), "fa": ("قبول", "رد")}
NAMES_FA = {"collectives": "عملیات جمعی", "data parallel": "موازی‌سازی داده", "pipeline": "پایپلاین",
            "checkpoints": "چکپوینت", "capstone": "پروژهٔ پایانی"}  # ZeRO-1 and ZeRO-3 are names
ONE_GPU = ("one GPU: NCCL needs one GPU per rank, so these checks run on 4 CPU ranks (gloo)",
           "یک GPU: NCCL برای هر رتبه یک GPU می‌خواهد، پس این وارسی‌ها روی ۴ رتبهٔ CPU (gloo) اجرا "
           "می‌شوند")


def report_line(lesson: str, name: str, results: list[dict], lang: str) -> str:
    """The line of one check in `lang`: lesson, check, verdict, where it ran, what it found."""
    first, index = results[0], language.LANGUAGES.index(language.check_language(lang))
    detail = first["error"] if "error" in first else language.fill(
        DETAILS[name][index], lang, **first["facts"])
    return language.fill(LINE[index], lang, lesson=int(lesson),
                         name=NAMES_FA.get(name, name) if lang == "fa" else name,
                         verdict=VERDICTS[lang][not all(r["ok"] for r in results)],
                         backend=first["backend"], ranks=len(results),
                         device=language.isolated(first["device"]) if lang == "fa" else first["device"],
                         detail=detail, seconds=first["seconds"])


CHECKS: dict[str, list[tuple[str, Callable[[int, int], dict]]]] = {  # lesson: its checks
    "76": [("collectives", collectives_within_bound)],
    "77": [("data parallel", ddp_matches_one_process)],
    "78": [("ZeRO-1", zero_matches_adam), ("ZeRO-3", zero3_matches_fsdp2_and_adam)],
    "79": [("pipeline", pipeline_matches_unsplit)],
    "80": [("checkpoints", checkpoint_round_trip)],
    "81": [("capstone", capstone_resumes)],
}


def _all_ranks(flag: bool) -> bool:
    """True when `flag` is true on every rank. Collective: call on every rank."""
    verdict = torch.tensor([1.0 if flag else 0.0], device=current_device())
    dist.all_reduce(verdict, op=dist.ReduceOp.MIN)
    return bool(verdict.item())


def _same_on_all_ranks(path: str) -> str:
    """Rank 0's `path` on every rank (each rank made its own temporary folder; one is shared)."""
    chosen = [path]
    dist.broadcast_object_list(chosen, src=0)
    return chosen[0]


def check_on_every_rank(rank: int, world_size: int, lesson: str, index: int = 0) -> dict:
    """Run check `index` of lesson `lesson`; add the backend and device it ran on. Collective."""
    started = time.perf_counter()
    result = CHECKS[lesson][index][1](rank, world_size)
    return {**result, "backend": dist.get_backend(), "device": str(current_device()),
            "seconds": time.perf_counter() - started}


def main(argv: list[str] | None = None) -> int:
    """Run every lesson's checks, print one line each; exit 0 only when all pass."""
    parser = argparse.ArgumentParser(prog="python -m lesson_code.selfcheck", description=main.__doc__)
    parser.add_argument("--world-size", type=positive_int, default=None,
                        help="ranks (default: one per GPU, at most 4, else 4 CPU ranks)")
    parser.add_argument("--backend", choices=launch.BACKENDS, default="auto")
    parser.add_argument("--lessons", nargs="+", choices=list(CHECKS), default=list(CHECKS))
    add_language(parser)
    args = parser.parse_args(argv)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    # NCCL needs a GPU per rank: with one GPU the distributed paths need more ranks than GPUs,
    # so the default is then 4 CPU ranks (--backend nccl --world-size 1 uses the GPU alone).
    world_size = args.world_size or (min(gpus, 4) if gpus >= 2 and args.backend != "gloo" else 4)
    if gpus == 1 and args.world_size is None and args.backend == "auto":
        print(ONE_GPU[language.LANGUAGES.index(args.lang)])
    failures = 0
    checks = [(lesson, index, name) for lesson in args.lessons
              for index, (name, _) in enumerate(CHECKS[lesson])]
    for lesson, index, name in checks:
        try:
            results = launch.run(check_on_every_rank, lesson, index, world_size=world_size,
                                 backend=args.backend, timeout_s=300)
        except (launch.SpawnError, ValueError) as error:
            said = error.explain(args.lang) if isinstance(error, launch.SpawnError) else str(error)
            results = [{"ok": False, "error": said.splitlines()[0], "backend": "-",
                        "device": "-", "seconds": float("nan")}]
        failures += not all(r["ok"] for r in results)
        if launch.is_reporting_process():
            print(report_line(lesson, name, results, args.lang), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
