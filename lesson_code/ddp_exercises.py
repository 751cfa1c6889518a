"""The exercises of lessons 77 and 77a, and two demonstrations beside lesson 77's main story.

The lesson's own harness (DDPRun, training on ranks against one process, the timing, the model
of a bucketed backward) is `lesson_code.ddp_lab`; this module holds what only the exercises and
their worked solutions run, and the two side demonstrations: `no_sync_timing_demo` (why the
flag is read at forward time) and `bucket_counts` (our bucket rule against PyTorch DDP's).
Rank functions run through `launch.spawn`, as the lesson's cells call them, e.g.

    launch.spawn(ddp_exercises.registration_order_demo, world_size=4)  # lesson 77a, exercise 3
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from lesson_code.collectives.ledger import CommLedger
from lesson_code.ddp import BucketedDDP, bucket_groups
from lesson_code.ddp_lab import DDPRun, accumulated_loss, make_optimizer, train_single_process, wrap
from lesson_code.experiment import flat_parameters, train
from lesson_code.models import build_model
from lesson_code.runtime.devices import current_device


def no_sync_timing_demo(rank: int, world_size: int) -> dict[str, dict[str, bool]]:
    """Do gradients agree across ranks when no_sync() covers only the forward, or only backward?
    For BucketedDDP ("bucketed") and torch's DistributedDataParallel ("torch"), which both read
    the flag at forward time: {wrapper: {case: agree}}.

    Collective: call on every rank. Every rank has different data; a synchronised backward makes
    their gradients identical."""
    device = current_device()
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(rank)).to(device)
    target = torch.zeros(4, dtype=torch.long, device=device)
    wrappers = {"bucketed": lambda m: BucketedDDP(m, bucket_cap_mb=0.01),
                "torch": lambda m: DistributedDataParallel(m, bucket_cap_mb=0.01)}
    outcomes = {}
    for name, wrap_model in wrappers.items():
        model = wrap_model(build_model("mlp", 0, device=device))
        outcomes[name] = {}
        for case in ("forward inside no_sync", "backward inside no_sync"):
            model.zero_grad()
            with model.no_sync() if case.startswith("forward") else nullcontext():
                loss = model(x, target)[1]
            with model.no_sync() if case.startswith("backward") else nullcontext():
                loss.backward()
            grad = model.module.layers[0].weight.grad.clone()
            gathered = [torch.empty_like(grad) for _ in range(world_size)]
            dist.all_gather(gathered, grad)
            outcomes[name][case] = all(torch.equal(g, gathered[0]) for g in gathered)
    return outcomes


def bucket_counts(sizes: list[int], bucket_mbs: list[float]) -> list[dict]:
    """How many buckets gradients of `sizes` bytes (in the order the backward makes them) fill
    at each cap of `bucket_mbs` (MiB), by two rules: `bucket_groups`' (what BucketedDDP and
    overlap_model cut: a bucket never goes over the cap unless one tensor alone does) and
    PyTorch DDP's (`dist._compute_bucket_assignment_by_size`: a bucket closes once it reaches the
    cap, so it can go over by one tensor, and fewer buckets come out)."""
    gradients = [torch.empty(nbytes // 4) for nbytes in sizes]  # float32, as the models' are
    return [{"bucket MiB": mb, "buckets, our rule": len(bucket_groups(sizes, int(mb * 2 ** 20))),
             "buckets, PyTorch's rule": len(dist._compute_bucket_assignment_by_size(
                 gradients, [int(mb * 2 ** 20)])[0])}
            for mb in bucket_mbs]


def ledger_per_step(rank: int, world_size: int, run: DDPRun) -> dict[str, int]:
    """What this rank sends for one training step: the gradients' all-reduces (ring all-reduce,
    whose messages and bytes the lesson derives; the ledger counts them) and the one-number
    check all-reduces each synchronised backward adds (`_agree_on_missing`), which go through
    torch.distributed, outside the ledger. Collective: call on every rank. The initial broadcast
    is not counted."""
    ledger = CommLedger()
    model = wrap(replace(run, comm="ring", all_reduce="ring"),
                 build_model(run.model, run.seed, run.gpt, current_device()), ledger)
    ledger.clear()
    train(lambda step: accumulated_loss(run, model, step, rank, world_size),
          make_optimizer(run, model.parameters()), range(1))
    totals = ledger.totals()["all_reduce"]
    return {"gradient all-reduces": totals["calls"], "messages sent": totals["messages_sent"],
            "bytes sent": totals["bytes_sent"],
            "check all-reduces (one number, outside the ledger)": model.checks}


def clipping_under_no_sync(rank: int, world_size: int, run: DDPRun) -> dict[str, dict]:
    """Lesson 77, exercise 5: gradient accumulation over `run.accumulation` micro-batches, all but
    the last inside `no_sync()`, with `clip_grad_norm_` called once, after the synchronising
    backward ("clipped once, after the average"), or after every micro-batch's backward
    ("clipped after every backward"). Collective: every rank.

    BucketedDDP on the ring. The norm limit is a tenth of the norm of one process's gradient on
    the whole batch (`run.batch(0)`), so every clip acts. Returns, per placement, whether the
    ranks hold the same gradient, and its largest difference from that process's clipped
    gradient, also relative to that gradient's largest element."""
    device = current_device()
    whole = build_model(run.model, run.seed, run.gpt, device)
    whole(*run.batch(0))[1].backward()
    norm = torch.linalg.vector_norm(torch.cat([p.grad.reshape(-1) for p in whole.parameters()]))
    max_norm = 0.1 * norm.item()
    nn.utils.clip_grad_norm_(whole.parameters(), max_norm)
    expected = torch.cat([p.grad.reshape(-1) for p in whole.parameters()])
    micro = list(zip(*(torch.tensor_split(t, run.accumulation)
                       for t in run.local_batch(0, rank, world_size))))
    results = {}
    for placement in ("clipped once, after the average", "clipped after every backward"):
        model = wrap(replace(run, wrapper="bucketed", comm="ring", all_reduce="ring"),
                     build_model(run.model, run.seed, run.gpt, device))
        for index, (xm, ym) in enumerate(micro):
            last = index == len(micro) - 1  # only the last micro-batch's backward all-reduces
            with nullcontext() if last else model.no_sync():
                (model(xm, ym)[1] / run.accumulation).backward()
            if last or placement == "clipped after every backward":
                nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        got = torch.cat([p.grad.reshape(-1) for p in model.module.parameters()])
        gathered = [torch.empty_like(got) for _ in range(world_size)]
        dist.all_gather(gathered, got)
        error = (got - expected).abs().max().item()
        results[placement] = {"ranks_identical": all(torch.equal(g, gathered[0]) for g in gathered),
                              "largest difference from one process": error,
                              "relative to the largest gradient element":
                                  error / expected.abs().max().item()}
    return results


def token_weighted_gradients(rank: int, world_size: int, seed: int = 0) -> dict[str, float]:
    """Lesson 77, exercise 3: ranks whose slices count different numbers of tokens in the loss.

    Collective: call on every rank. MiniGPT on `DDPRun(model="gpt")`'s first batch, rank r's
    slice with the targets of its first 4 * r positions masked out (-100, which cross-entropy
    skips). Returns the largest gradient difference from one process on the whole batch, whose
    loss is the mean over every counted token: (a) when each rank averages its own tokens and
    the wrapper averages the ranks, (b) when the ranks first all-reduce the count of counted
    tokens and each rank divides the sum of its token losses by that global count (times N,
    since the wrapper divides by N); and the token counts of the ranks."""
    device = current_device()
    x, y = (t.to(device) for t in DDPRun(model="gpt", seed=seed).batch(0))
    y = y.clone()
    slices = torch.tensor_split(torch.arange(len(y), device=device), world_size)
    for r, rows in enumerate(slices):
        y[rows, :4 * r] = -100
    reference = build_model("gpt", seed, device=device)
    reference(x, y)[1].backward()  # the mean over every counted token of the whole batch
    expected = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
    mine = slices[rank]
    local_tokens = (y[mine] != -100).sum().reshape(1).float()
    counts = [torch.zeros_like(local_tokens) for _ in range(world_size)]
    dist.all_gather(counts, local_tokens)
    diffs = {}
    for case in ("per-rank mean", "global token count"):
        model = BucketedDDP(build_model("gpt", seed, device=device), bucket_cap_mb=0.05)
        logits = model(x[mine])[0]
        token_losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[mine].reshape(-1),
                                       reduction="sum")
        if case == "per-rank mean":
            loss = token_losses / local_tokens
        else:
            total = local_tokens.clone()
            dist.all_reduce(total)  # every rank's counted tokens
            loss = token_losses * world_size / total
        loss.sum().backward()
        got = torch.cat([p.grad.reshape(-1) for p in model.module.parameters()])
        diffs[case] = (got - expected).abs().max().item()
        model.comm.close()
    return {**diffs, "largest gradient": expected.abs().max().item(),
            "tokens per rank": [int(c.item()) for c in counts]}


def cast_allreduce_hook(state: dict, bucket):  # unannotated: see the docstring's last line
    """A torch DDP communication hook: average each `dist.GradBucket` in `state["dtype"]`, then
    cast back; returns a torch.futures.Future of the bucket's averaged float32 buffer.

    torch's `bf16_compress_hook` (cast, divide by the world size, all-reduce a sum, copy back)
    under a name that `register_comm_hook` accepts on gloo. With float32 it is DDP's own average.
    `state["largest"]` keeps the largest |gradient| of this rank it has reduced.
    No annotations: `register_comm_hook` accepts only the classes `dist.GradBucket` and
    `Future[Tensor]`, which this module's `from __future__ import annotations` makes strings.
    """
    buffer = bucket.buffer()
    state["largest"] = max(state["largest"], buffer.abs().max().item())
    compressed = buffer.to(state["dtype"]).div_(dist.get_world_size())

    def decompress(future: torch.futures.Future) -> torch.Tensor:
        buffer.copy_(future.value()[0])
        return buffer

    return dist.all_reduce(compressed, async_op=True).get_future().then(decompress)


def reduced_in(rank: int, world_size: int, run: DDPRun) -> list[dict]:
    """Lesson 77a, exercise 2: torch DDP with each bucket averaged in float32 and in bfloat16
    (`cast_allreduce_hook`), each trained `run.steps` steps against one process on the full batch.

    Collective: call on every rank. Returns, per dtype, whether the ranks agree, the largest
    parameter difference from one process, and the largest |gradient| any rank reduced."""
    reference = train_single_process(replace(run, accumulation=1))["params"]
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        model = DistributedDataParallel(build_model(run.model, run.seed + rank, run.gpt, current_device()),
                                        bucket_cap_mb=run.bucket_cap_mb)
        state = {"dtype": dtype, "largest": 0.0}
        model.register_comm_hook(state, cast_allreduce_hook)
        train(lambda step: accumulated_loss(run, model, step, rank, world_size),
              make_optimizer(run, model.parameters()), range(run.steps))
        params = flat_parameters(model.module)
        gathered = [torch.empty_like(params) for _ in range(world_size)]
        dist.all_gather(gathered, params)
        largest = torch.tensor([state["largest"]], device=current_device())
        dist.all_reduce(largest, op=dist.ReduceOp.MAX)
        rows.append({"reduced in": str(dtype).removeprefix("torch."),
                     "ranks_identical": all(torch.equal(p, gathered[0]) for p in gathered),
                     "max_param_diff": (params - reference).abs().max().item(),
                     "largest |gradient|": largest.item()})
    return rows


class ReverseRegistered(nn.Module):
    """Lesson 77a, exercise 3: `depth` Linear layers registered in one order and run in the
    other, so that backward produces the last-registered layer's gradients last;
    `forward(x, targets)` returns (output, mean squared error), as the course's models do."""

    def __init__(self, width: int = 64, depth: int = 6):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x: torch.Tensor, targets: torch.Tensor):
        for layer in reversed(self.layers):  # the last registered runs first
            x = torch.tanh(layer(x))
        return x, F.mse_loss(x, targets)


def registration_order_demo(rank: int, world_size: int, steps: int = 3) -> list[dict]:
    """Lesson 77a, exercise 3: how many of BucketedDDP's all-reduces start during the backward
    (before its last gradient arrives), step by step, on a ReverseRegistered model with one layer
    per bucket, with rebuild_buckets=True. Collective: call on every rank. Also gives, per step,
    the largest difference between the wrapper's gradient and the mean of the ranks' own
    gradients (computed apart, with torch.distributed), which no cut of the buckets may change
    beyond rounding."""
    torch.manual_seed(0)
    device = current_device()
    model = BucketedDDP(ReverseRegistered().to(device), bucket_cap_mb=0.02, rebuild_buckets=True)
    generator = torch.Generator().manual_seed(rank)
    rows = []
    for step in range(steps):
        x, target = (torch.randn(8, 64, generator=generator).to(device) for _ in range(2))
        own = torch.autograd.grad(model.module(x, target)[1], model.params)  # no hook fires
        mean = torch.cat([g.reshape(-1) for g in own])
        dist.all_reduce(mean)
        mean /= world_size
        model.zero_grad()
        model(x, target)[1].backward()
        total = len(model.params)
        rows.append({"step": step + 1, "buckets": len(model.buckets),
                     "started during backward": sum(row["gradients before"] < total
                                                    for row in model.timeline),
                     "largest difference from the mean gradient": (torch.cat(
                         [p.grad.reshape(-1) for p in model.params]) - mean).abs().max().item()})
    model.comm.close()
    return rows
