"""Lesson 77's reference data-parallel job under torchrun, put together from the lesson's pieces.

    torchrun --nproc-per-node=8 -m lesson_code.jobs.ddp_torchrun          # one process per GPU
    torchrun --nproc-per-node=2 -m lesson_code.jobs.ddp_torchrun --cpu    # gloo, a quick check
    torchrun --nproc-per-node=2 -m lesson_code.jobs.ddp_torchrun --cpu --lang fa   # in Persian

Lesson 77 shows `train_epochs`, its loop, and runs the job on 2 CPU processes with gloo (the
book's machine has no GPU); a test runs it on 3. Its data are `data.make_batch`'s synthetic sequences: swap in a real dataset.
"""

from __future__ import annotations

import argparse
import os
from contextlib import nullcontext
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from lesson_code import launch
from lesson_code.data import make_batch
from lesson_code.harness.cli_args import add_language, positive_int
from lesson_code.language import number
from lesson_code.models import build_model

SAY = {"en": "last micro-batch loss on rank 0: {loss}",
       "fa": "زیان آخرین میکرودستهٔ رتبهٔ ۰: {loss}"}


def train_job(cuda: bool = True, epochs: int = 2, accumulation: int = 4,
              checkpoint: str = "ddp_job.pt", timeout_s: float = 600.0) -> float:
    """Train MiniGPT with DDP in this torchrun process; return its last micro-batch loss.

    Each optimizer step averages `accumulation` micro-batches of 4 sequences per rank (fewer in
    an epoch's last step when the epoch's micro-batches do not divide evenly): only the last one
    all-reduces, the others run inside `no_sync()` (`train_epochs`). Every collective waits at
    most `timeout_s`. Rank 0 saves the bare model's state_dict to `checkpoint`.
    """
    local_rank = int(os.environ["LOCAL_RANK"])  # set by torchrun, with RANK and WORLD_SIZE
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None,
                            timeout=timedelta(seconds=timeout_s))  # a hung peer ends the job
    try:
        rank = dist.get_rank()
        torch.manual_seed(rank)  # dropout, augmentation: independent draws on each rank
        model = DistributedDataParallel(build_model("gpt", seed=0, device=device),
                                        device_ids=[local_rank] if cuda else None)
        dataset = TensorDataset(*make_batch("gpt", 256, step=0))  # 256 synthetic sequences
        sampler = DistributedSampler(dataset, seed=0, drop_last=True)  # a slice per rank
        loader = DataLoader(dataset, batch_size=4, sampler=sampler, drop_last=True)  # equal sizes
        if len(loader) == 0:
            raise ValueError(f"{dist.get_world_size()} ranks leave no micro-batch of 4 of the "
                             f"{len(dataset)} sequences on a rank: use at most "
                             f"{len(dataset) // 4} ranks")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loss = train_epochs(model, loader, optimizer, epochs, accumulation, device)
        if rank == 0:
            torch.save(model.module.state_dict(), checkpoint)  # keys without "module."
        return loss
    finally:
        dist.destroy_process_group()


def train_epochs(model: DistributedDataParallel, loader: DataLoader, optimizer, epochs: int,
                 accumulation: int, device: torch.device) -> float:
    """Train `epochs` epochs of `loader` (a DistributedSampler's); return the last micro-batch's loss."""
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        for index, (x, y) in enumerate(loader):
            first = index - index % accumulation  # this step's first micro-batch
            window = min(accumulation, len(loader) - first)  # the epoch's last may be short
            synchronise = index == first + window - 1  # a step's last micro-batch
            with nullcontext() if synchronise else model.no_sync():  # forward and backward
                loss = model(x.to(device), y.to(device))[1] / window
                loss.backward()
            if synchronise:  # .grad holds the ranks' average: clip it, then step
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    return window * loss.item()


def main(argv: list[str] | None = None) -> int:
    """Run `train_job` in this torchrun process and print rank 0's last micro-batch loss.

    Exits with status 2, before any process group starts, when it was not started by torchrun
    or when it is asked for GPUs that this machine does not have."""
    parser = argparse.ArgumentParser(prog="torchrun --nproc-per-node=N -m lesson_code.jobs.ddp_torchrun",
                                     description=main.__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="gloo on CPU instead of NCCL on GPUs")
    parser.add_argument("--epochs", type=positive_int, default=2)
    parser.add_argument("--checkpoint", default="ddp_job.pt")
    parser.add_argument("--timeout-s", type=positive_int, default=600,
                        help="the longest any collective waits, in seconds (default 600)")
    add_language(parser)
    args = parser.parse_args(argv)
    if not launch.under_torchrun() or "LOCAL_RANK" not in os.environ:
        parser.error("this job runs one process per rank under torchrun: start it with "
                     "torchrun --nproc-per-node=2 -m lesson_code.jobs.ddp_torchrun --cpu")
    if not args.cpu and not torch.cuda.is_available():
        parser.error("this machine has no CUDA device: pass --cpu to run on gloo")
    loss = train_job(cuda=not args.cpu, epochs=args.epochs, checkpoint=args.checkpoint,
                     timeout_s=args.timeout_s)
    if os.environ.get("RANK") == "0":
        print(SAY[args.lang].format(loss=number(loss, args.lang, ".3f")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
