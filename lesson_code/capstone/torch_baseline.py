"""Lesson 81's capstone run written with PyTorch's own pieces, for comparison (`make bench`).

The same model, corpus, seeds, learning rate and 20 steps on the same launcher, but
DistributedDataParallel (broadcast and gradient all-reduce), ZeroRedundancyOptimizer (ZeRO-1 over
Adam) and, after step 10, a checkpoint a run could continue from: the model's weights through
torch.distributed.checkpoint (DCP), and the whole optimizer state, which ZeroRedundancyOptimizer
gathers to rank 0 (`consolidate_state_dict`) for rank 0 to write.

    python -m lesson_code.capstone.torch_baseline [--out-dir DIR]

It writes into capstone-torch-run/ by default (ignored by git, as the capstone's capstone-run/ is).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import torch

from lesson_code import launch
from lesson_code.capstone.config import CapstoneConfig
from lesson_code.harness.cli_args import positive_int
from lesson_code.data import batch_for_step
from lesson_code.runtime.devices import current_device
from lesson_code.experiment import flat_parameters, train
from lesson_code.models import MiniGPT


def run_rank(rank: int, world_size: int, config: CapstoneConfig) -> dict:
    """Train with DDP + ZeroRedundancyOptimizer; save model and optimizer after `checkpoint_step`.

    With `config.max_grad_norm` the gradients are clipped to that global norm before each step
    (`torch.nn.utils.clip_grad_norm_`). Collective: call on every rank. Returns {"losses": the
    global mean loss of every step, "grad_norms": the global norm of every step's averaged gradient
    (before clipping, as the capstone logs its grad_norm), "params": the final parameters, flat,
    "moment_bytes": the bytes of Adam's two moments on this rank}. The checkpoint is the folder
    `out_dir/dcp-step-N`: the model through DCP, and `optimizer.pt`, written by rank 0.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(config.seed + rank)
    model = DistributedDataParallel(MiniGPT(config.gpt).to(current_device()))
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                        lr=config.lr)
    corpus = config.corpus()

    def step_loss(step: int) -> torch.Tensor:
        x, y = batch_for_step(corpus, step, rank, world_size, config.batch_per_rank,
                              config.gpt.context)
        return model(x.to(current_device()), y.to(current_device()))[1]

    def after_step(done: int) -> None:
        if done == config.checkpoint_step:
            folder = Path(config.out_dir) / f"dcp-step-{done}"
            dcp.save({"model": model.module.state_dict()}, checkpoint_id=str(folder))
            # ZeroRedundancyOptimizer's way to save: a collective that gathers every rank's
            # shard of Adam's state to rank 0, which alone holds (and writes) the whole of it.
            optimizer.consolidate_state_dict(to=0)
            if rank == 0:
                torch.save(optimizer.state_dict(), folder / "optimizer.pt")
    grad_norms = []

    def norm_and_clip() -> None:  # what clip_grad_norm_ does, keeping the norm it computes
        norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
        grad_norms.append(norm.item())
        if config.max_grad_norm is not None:
            torch.nn.utils.clip_grads_with_norm_(model.parameters(), config.max_grad_norm, norm)
    losses = train(step_loss, optimizer, range(config.steps), after_step=after_step,
                   before_step=norm_and_clip)
    moments = [t for state in optimizer.optim.state.values()  # this rank's Adam: its parameters only
               for key, t in state.items() if key in ("exp_avg", "exp_avg_sq")]
    return {"losses": losses, "grad_norms": grad_norms, "params": flat_parameters(model.module),
            "moment_bytes": sum(t.untyped_storage().nbytes() for t in moments)}


def main(argv: list[str] | None = None) -> int:
    """Run the baseline on `--world-size` ranks; print its loss per step and its wall time."""
    parser = argparse.ArgumentParser(prog="python -m lesson_code.capstone.torch_baseline",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default="capstone-torch-run")
    parser.add_argument("--world-size", type=positive_int, default=4)
    args = parser.parse_args(argv)
    config = dataclasses.replace(CapstoneConfig(), out_dir=args.out_dir, world_size=args.world_size)
    start = time.perf_counter()
    losses = launch.run(run_rank, config, world_size=config.world_size)[0]["losses"]
    if launch.is_reporting_process():
        for step, loss in enumerate(losses, start=1):
            print(f"{step:4d}  {loss:.5f}")
        print(f"trained in {time.perf_counter() - start:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
