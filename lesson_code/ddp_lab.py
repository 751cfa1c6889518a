"""Rank functions of lesson 77: train with our DDP wrappers or torch DDP, and time each phase.

The notebook, the tests and the benchmark run these through `launch.spawn` (or torchrun) and
compare with `train_single_process`, one process on the full batch. A `DDPRun` (a frozen
`experiment.RunConfig`) says what to train; the loop and the timing are `lesson_code.experiment`'s.
The model of a bucketed backward (`overlap_model`, `bucket_sweep`, `ModelledCluster`) is plain
arithmetic, with no ranks: the lesson compares it with the stored benchmark and runs it for a cluster.

    python -m lesson_code.ddp_lab          # 4 ranks: our wrappers and torch DDP vs one process
    python -m lesson_code.ddp_lab --lang fa  # the same, reported in Persian
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from lesson_code import language, launch
from lesson_code.harness import cli_args
from lesson_code.collectives.ledger import CommLedger
from lesson_code.collectives import cost_model
from lesson_code.ddp import BucketedDDP, NaiveDDP, broadcast_parameters, bucket_groups
from lesson_code.runtime.devices import current_device
from lesson_code.experiment import RunConfig, flat_parameters, train
from lesson_code.harness.timing import PhaseClock
from lesson_code.models import GPTConfig, MiniGPT, build_model, gpt_parameters
from lesson_code.harness.validate import require_choice, require_positive_int

WRAPPERS = ("naive", "bucketed", "torch")
OPTIMIZERS = {"sgd": (torch.optim.SGD, 0.1), "adam": (torch.optim.Adam, 1e-2)}  # class, lr


@dataclass(frozen=True)
class DDPRun(RunConfig):
    """A run of lesson 77: RunConfig's settings, plus wrapper, optimizer, accumulation, buckets.
    Raises ValueError for an unknown wrapper or optimizer, or an accumulation below 1."""

    wrapper: str = "bucketed"      # "naive", "bucketed" or "torch" (DistributedDataParallel)
    optimizer: str = "sgd"         # "sgd" (lr 0.1) or "adam" (lr 1e-2)
    accumulation: int = 1          # micro-batches per step; all but the last under no_sync()
    bucket_cap_mb: float = 0.01    # small, so that even the MLP spans several buckets

    def __post_init__(self):
        super().__post_init__()
        require_choice("wrapper", self.wrapper, WRAPPERS)
        require_choice("optimizer", self.optimizer, OPTIMIZERS)
        require_positive_int("accumulation", self.accumulation)


def _optimizer(run: DDPRun, params) -> torch.optim.Optimizer:
    """The torch.optim optimizer `run.optimizer` names, at its learning rate in OPTIMIZERS."""
    optimizer_class, lr = OPTIMIZERS[run.optimizer]
    return optimizer_class(params, lr=lr)


def train_single_process(run: DDPRun) -> dict:
    """The reference: one process, the full batch, plain torch.optim (no wrapper, no accumulation).

    Runs in a group of one: compute it with `reference.in_one_rank`, so that it also runs with the
    ranks' thread count. Returns the final parameters (float64) and the loss of each step."""
    model = build_model(run.model, run.seed, run.gpt, current_device())
    losses = train(lambda step: model(*run.batch(step))[1], _optimizer(run, model.parameters()),
                   range(run.steps))
    return {"params": flat_parameters(model), "losses": losses}


def wrap(run: DDPRun, model: nn.Module, ledger: CommLedger | None = None,
         record_events: bool = False) -> nn.Module:
    """Wrap `model` in the data-parallel wrapper `run.wrapper` names. Collective: every rank."""
    if run.wrapper == "torch":
        return DistributedDataParallel(model, bucket_cap_mb=run.bucket_cap_mb)
    comm = run.communicator(ledger, record_events=record_events)
    if run.wrapper == "naive":
        return NaiveDDP(model, comm=comm)
    return BucketedDDP(model, bucket_cap_mb=run.bucket_cap_mb, comm=comm)


def accumulated_loss(run: DDPRun, model: nn.Module, step: int, rank: int,
                     world_size: int) -> torch.Tensor:
    """This rank's loss of `step` over `run.accumulation` micro-batches, for the caller's backward.

    Each micro-batch's loss is divided by their number, so the gradients add up to the slice's
    mean. All but the last micro-batch run forward and backward here inside `no_sync()` (their
    gradients accumulate locally); the caller's backward of the last averages the sum across
    ranks. Their losses are added to the last's detached: its value is the slice's mean loss.
    """
    x, y = run.local_batch(step, rank, world_size)
    micro = list(zip(*(torch.tensor_split(t, run.accumulation) for t in (x, y))))
    earlier = torch.zeros((), dtype=torch.float64, device=x.device)
    for xm, ym in micro[:-1]:
        with model.no_sync():
            loss = model(xm, ym)[1] / run.accumulation
            loss.backward()
        earlier += loss.detach()
    xm, ym = micro[-1]
    return model(xm, ym)[1] / run.accumulation + earlier


def train_ranks(rank: int, world_size: int, run: DDPRun) -> dict:
    """Train with `run.wrapper` on this rank's slice; return final parameters and global losses.

    Collective: call on every rank. Each rank builds its model from seed + rank, so only the
    wrapper's initial broadcast can make them agree. Losses are averaged over ranks.
    """
    model = wrap(run, build_model(run.model, run.seed + rank, run.gpt, current_device()))
    losses = train(lambda step: accumulated_loss(run, model, step, rank, world_size),
                   _optimizer(run, model.parameters()), range(run.steps))
    return {"params": flat_parameters(model.module), "losses": losses}


def timed_step(clock: PhaseClock, optimizer, loss_of_step: Callable[[], torch.Tensor]) -> float:
    """One training step timed by `clock`: "forward" (zero_grad and the loss), "backward",
    "optimizer", and "step" for the whole. Collective: every rank starts together. Returns when
    the step began (time.perf_counter seconds), to place other events against it."""
    clock.start()
    began = time.perf_counter()
    optimizer.zero_grad()
    loss = loss_of_step()
    clock.lap("forward")
    loss.backward()
    clock.lap("backward")
    optimizer.step()
    clock.lap("optimizer")
    clock.stop()
    return began


def time_steps(rank: int, world_size: int, run: DDPRun, warmup: int = 2) -> dict:
    """Median seconds per phase over `run.steps` timed steps (after `warmup` steps).

    Collective: call on every rank. Phases: forward, backward (for torch DDP it includes the
    communication DDP waits for inside backward), wait (communication not hidden behind backward),
    optimizer, step; comm is the communication's own duration (ring only)."""
    model = wrap(run, build_model(run.model, run.seed, run.gpt, current_device()), record_events=True)
    optimizer = _optimizer(run, model.parameters())
    clock = PhaseClock()
    for step in range(warmup + run.steps):
        if step == warmup:
            clock.discard()
        batch = run.local_batch(step, rank, world_size)  # made before the clock starts
        timed_step(clock, optimizer, lambda: model(*batch)[1])
        stats = getattr(model, "stats", None)  # torch DDP keeps no such record: NaN below
        wait = stats["wait_s"] if stats else float("nan")
        clock.samples["backward"][-1] -= wait if stats else 0.0  # our wrappers wait at its end
        clock.samples.setdefault("wait", []).append(wait)
        clock.samples.setdefault("comm", []).append(stats["comm_s"] if stats else float("nan"))
    return clock.medians()


def overlap_timeline(rank: int, world_size: int, run: DDPRun) -> dict:
    """Measured events of one bucketed step (after a warm-up), relative to the forward's start.

    Collective: call on every rank. Returns forward, backward and wait spans and, per bucket,
    when its last gradient arrived and when its ring all-reduce ran."""
    run = replace(run, wrapper="bucketed", comm="ring")
    model = wrap(run, build_model(run.model, run.seed, run.gpt, current_device()), record_events=True)
    optimizer = _optimizer(run, model.parameters())
    clock = PhaseClock()
    for step in range(2):
        batch = run.local_batch(step, rank, world_size)
        began = timed_step(clock, optimizer, lambda: model(*batch)[1])
    forward, backward = clock.samples["forward"][-1], clock.samples["backward"][-1]
    computed = forward + backward - model.stats["wait_s"]  # when backward's own work ended
    buckets = [{key: (value - began if key in ("ready", "start", "end") else value)
                for key, value in row.items()} for row in model.timeline]
    return {"forward": (0.0, forward), "backward": (forward, computed),
            "wait": (computed, forward + backward), "buckets": buckets}


def overlap_model(sizes: list[int], bucket_cap_mb: float, backward_s: float, alpha: float,
                  beta: float, world_size: int) -> dict:
    """A model of one bucketed backward pass, which lesson 77's explorer draws.

    `sizes` are the gradients' bytes in the order backward produces them (reverse registration
    order, as BucketedDDP sees them). Gradient i is ready once the backward has spent a share of
    `backward_s` proportional to the bytes so far (a matmul's backward costs in proportion to its
    weights); buckets are cut as BucketedDDP cuts them (`bucket_groups`); each bucket's all-reduce
    starts when its last gradient is ready and the previous all-reduce has finished, and lasts
    the ring's alpha-beta time (`cost_model.predict`). Returns {"buckets": [{"bytes", "ready",
    "start", "end"}], "backward_s", "exposed_s"}: exposed is the communication still running
    after the backward ended, the wait the step pays. The model gives communication hardware of
    its own that leaves the backward as fast as it is alone; on a CPU whose cores the backward
    also needs, both slow down, and overlap can cost the step more than it hides.
    """
    total, done, ready_at = sum(sizes), 0, []
    for nbytes in sizes:
        done += nbytes
        ready_at.append(backward_s * done / total)
    buckets, previous_end = [], 0.0
    for group in bucket_groups(sizes, int(bucket_cap_mb * 2 ** 20)):
        nbytes = sum(sizes[index] for index in group)
        start = max(ready_at[group[-1]], previous_end)
        previous_end = start + cost_model.predict("all_reduce", nbytes, world_size, alpha, beta)
        buckets.append({"bytes": nbytes, "ready": ready_at[group[-1]], "start": start,
                        "end": previous_end})
    return {"buckets": buckets, "backward_s": backward_s,
            "exposed_s": max(0.0, previous_end - backward_s)}


def gradient_sizes(config: GPTConfig) -> list[int]:
    """Bytes of each float32 gradient of a MiniGPT of shape `config`, in the order backward
    produces them (reverse registration order, as BucketedDDP sees them). Built on the meta
    device: no memory is allocated, so a model of any size can be measured this way."""
    with torch.device("meta"):
        model = MiniGPT(config)
    return [p.numel() * p.element_size() for p in reversed(list(model.parameters()))]


@dataclass(frozen=True)
class ModelledCluster:
    """The cluster lesson 77 models (nothing here is measured): overlap_model's inputs for a
    MiniGPT of GPT-2 small's shape, data parallel over `world_size` GPUs in as many nodes.

    Constants, each an assumption named in the lesson: NCCL's latency per message `alpha_s`
    (5 us) and one 200 Gb/s InfiniBand link per GPU (`bandwidth`, 25 GB/s); `sequences` of
    `gpt.context` tokens per GPU; the backward's time is its 4 * parameters * tokens
    floating-point operations (twice the forward's 2 * parameters * tokens, attention's own
    T^2 term left out) at `flops_per_s`, 125 TFLOP/s (40% of an A100's 312 TFLOP/s bf16 peak);
    gradients are float32, as DDP reduces them under bf16 autocast.
    """

    gpt: GPTConfig = field(default_factory=lambda: GPTConfig(
        vocab_size=50257, context=1024, n_layer=12, n_embd=768, n_head=12))
    world_size: int = 4
    sequences: int = 8
    alpha_s: float = 5e-6
    bandwidth: float = 25e9        # bytes per second
    flops_per_s: float = 125e12

    def inputs(self) -> dict:
        """overlap_model's inputs: {"sizes", "backward_s", "alpha", "beta", "world_size"}."""
        tokens = self.sequences * self.gpt.context
        return {"sizes": gradient_sizes(self.gpt), "world_size": self.world_size,
                "backward_s": 4 * gpt_parameters(self.gpt) * tokens / self.flops_per_s,
                "alpha": self.alpha_s, "beta": 1 / self.bandwidth}


def bucket_sweep(inputs: dict, bucket_mbs: list[float]) -> list[dict]:
    """overlap_model at each bucket size of `bucket_mbs` for `inputs` (a dict as
    ModelledCluster.inputs returns): buckets, the communication left after the backward, and
    the backward plus that exposed part, the share of the step the bucket size changes (ms)."""
    rows = []
    for mb in bucket_mbs:
        model = overlap_model(inputs["sizes"], mb, inputs["backward_s"], inputs["alpha"],
                              inputs["beta"], inputs["world_size"])
        rows.append({"bucket MB": mb, "buckets": len(model["buckets"]),
                     "exposed comm, model (ms)": 1e3 * model["exposed_s"],
                     "backward + exposed, model (ms)": 1e3 * (model["backward_s"] + model["exposed_s"])})
    return rows


def attention_key_bias_mask(model: nn.Module) -> torch.Tensor:
    """True for the elements of the flat parameter vector that are MiniGPT attention key biases.

    Their true gradient is zero (the softmax ignores a shift shared by all scores of a query), so
    Adam walks them on rounding noise; comparisons across summation orders treat them apart.
    """
    mask = []
    for name, param in model.named_parameters():
        element = torch.zeros(param.numel(), dtype=torch.bool)
        if name.endswith("attn.qkv.bias"):  # query, key, value biases: the middle third
            element[param.numel() // 3: 2 * param.numel() // 3] = True
        mask.append(element)
    return torch.cat(mask)


def broadcast_demo(rank: int, world_size: int, seed: int = 0) -> dict:
    """Parameter norm of a MiniGPT built from seed + rank, before and after `broadcast_parameters`.
    Collective: call on every rank."""
    model = build_model("gpt", seed + rank, device=current_device())
    before = flat_parameters(model).norm().item()
    broadcast_parameters(model)
    return {"rank": rank, "norm before": before, "norm after": flat_parameters(model).norm().item()}


def no_sync_timing_demo(rank: int, world_size: int) -> dict[str, bool]:
    """Do gradients agree across ranks when no_sync() covers only the forward, or only backward?

    Collective: call on every rank. Every rank has different data; a synchronised backward makes
    their gradients identical."""
    device = current_device()
    model = BucketedDDP(build_model("mlp", 0, device=device), bucket_cap_mb=0.01)
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(rank)).to(device)
    target = torch.zeros(4, dtype=torch.long, device=device)
    outcomes = {}
    for case in ("forward inside no_sync", "backward inside no_sync"):
        model.zero_grad()
        with model.no_sync() if case.startswith("forward") else nullcontext():
            loss = model(x, target)[1]
        with model.no_sync() if case.startswith("backward") else nullcontext():
            loss.backward()
        grad = model.module.layers[0].weight.grad.clone()
        gathered = [torch.empty_like(grad) for _ in range(world_size)]
        dist.all_gather(gathered, grad)
        outcomes[case] = all(torch.equal(g, gathered[0]) for g in gathered)
    return outcomes


def ledger_per_step(rank: int, world_size: int, run: DDPRun) -> dict[str, int]:
    """Calls, messages and bytes this rank sends for one training step (ring all-reduce, whose
    bytes the lesson derives). Collective: call on every rank. The initial broadcast is not counted."""
    ledger = CommLedger()
    model = wrap(replace(run, comm="ring", all_reduce="ring"),
                 build_model(run.model, run.seed, run.gpt, current_device()), ledger)
    ledger.clear()
    train(lambda step: accumulated_loss(run, model, step, rank, world_size),
          _optimizer(run, model.parameters()), range(1))
    totals = ledger.totals()["all_reduce"]
    return {"all-reduce calls": totals["calls"], "messages sent": totals["messages_sent"],
            "bytes sent": totals["bytes_sent"]}


def each_run(rank: int, world_size: int, fn: Callable, runs: list, *args) -> list:
    """`fn(rank, world_size, run, *args)` for each of `runs`, in order, in one process group.

    Collective: call on every rank. One start of the ranks serves several runs (starting ranks
    costs more than a small run), e.g. `launch.spawn(each_run, time_steps, runs)`.
    """
    return [fn(rank, world_size, run, *args) for run in runs]


def key_bias_gradients(seed: int = 0) -> dict[str, float]:
    """Largest |gradient| of MiniGPT's attention query, key and value biases on one batch.

    One process, no group. The key biases' true gradient is zero: adding the same number to all
    scores of a query leaves its softmax unchanged."""
    model = build_model("gpt", seed)
    model(*DDPRun(model="gpt", seed=seed).batch(0))[1].backward()
    grads = torch.stack([block.attn.qkv.bias.grad for block in model.blocks])  # (layers, 3C)
    query, key, value = grads.chunk(3, dim=1)
    return {"query bias": query.abs().max().item(), "key bias": key.abs().max().item(),
            "value bias": value.abs().max().item()}


def compare_all_on_rank(rank: int, world_size: int, runs: list[DDPRun]) -> list[dict]:
    """For each run: do the ranks agree, and how far are they from one process on the full batch?

    Collective: call on every rank; each process also trains the single-process reference.
    """
    rows = []
    for run in runs:
        reference = train_single_process(replace(run, accumulation=1))
        result = train_ranks(rank, world_size, run)
        params = [torch.empty_like(result["params"]) for _ in range(world_size)]
        dist.all_gather(params, result["params"])
        rows.append({
            "model": run.model, "optimizer": run.optimizer, "wrapper": run.wrapper,
            "accumulation": run.accumulation,
            "ranks_identical": all(torch.equal(p, params[0]) for p in params),
            "max_param_diff": (result["params"] - reference["params"]).abs().max().item(),
            "max_loss_diff": max(abs(a - b) for a, b in zip(result["losses"], reference["losses"])),
            "first_loss": result["losses"][0], "last_loss": result["losses"][-1],
        })
    return rows


# What lesson 77 prints (the command's report, a line of the notebook) in each edition, filled
# by `language.fill`; WORDS names the runs' models, optimizers, wrappers and communicators in
# Persian (the glossary's words; plots.ddp's tables show the same).
SAY = {
    "en": {"title": "lesson 77: data-parallel training on {ranks} ranks vs one process, {steps} steps",
           "row": "  {model:3s} {optimizer:4s} {wrapper:8s} ranks identical: {identical}  max |param diff| "
                  "{param_diff:.1e}  max |loss diff| {loss_diff:.1e}  loss {first:.3f} -> {last:.3f}",
           "gradients": "gradients: {mb:.1f} MB per rank",
           "auto": "auto's choice for a {mb:g} MB bucket on {ranks} ranks, from lesson 76's stored "
                   "times: {algorithm}",
           "fit": "ring all-reduce fitted to these times: α = {alpha_us:.0f} µs per message, "
                  "1/β = {gbps:.2f} GB/s",
           "cluster": "modelled cluster: a MiniGPT of GPT-2 small's shape, {parameters:,} "
                      "parameters, {mib:.0f} MiB of float32 gradients, a backward of "
                      "{backward_ms:.1f} ms on each of {ranks} GPUs"},
    "fa": {"title": "درس ۷۷: آموزش با موازی‌سازی داده روی {ranks} رتبه در برابر یک فرایند، {steps} گام",
           "row": "  {model} {optimizer} {wrapper}: رتبه‌ها یکسان: {identical}، بیشینهٔ |اختلاف پارامتر| "
                  "{param_diff:.1e}، بیشینهٔ |اختلاف زیان| {loss_diff:.1e}، زیان از {first:.3f} به "
                  "{last:.3f}",
           "gradients": "گرادیان‌ها: {mb:.1f} MB در هر رتبه",
           "auto": "انتخاب `auto` برای باکتی {mb:g} مگابایتی روی {ranks} رتبه، از زمان‌های "
                   "ذخیره‌شدهٔ درس ۷۶: `{algorithm}`",
           "fit": "کاهش همگانی حلقه‌ای، برازش‌شده به این زمان‌ها: α برابر {alpha_us:.0f} µs برای "
                  "هر پیام، پهنای باند 1/β برابر {gbps:.2f} GB/s",
           "cluster": "خوشهٔ مدل‌شده: یک MiniGPT به شکل GPT-2 کوچک، {parameters:,} پارامتر، "
                      "{mib:.0f} MiB گرادیان float32، گذر برگشتی {backward_ms:.1f} میلی‌ثانیه‌ای "
                      "روی هر یک از {ranks} GPU"},
}
WORDS = {"mlp": "MLP", "gpt": "MiniGPT", "sgd": "SGD", "adam": "Adam", "naive": "ساده‌لوحانه",
         "bucketed": "باکت‌دار", "torch": "DDP در PyTorch", "ring": "حلقه", "builtin": "توکار"}


def say(key: str, lang: str, **values) -> str:
    """Line `key` of SAY in edition `lang`, filled with `values` (`language.fill`); in Persian,
    a value that names a model, optimizer or wrapper takes its word in WORDS."""
    if language.check_language(lang) == "fa":
        values = {name: WORDS.get(value, value) if isinstance(value, str) else value
                  for name, value in values.items()}
    return language.fill(SAY[lang][key], lang, **values)


def main(argv: list[str] | None = None) -> int:
    """Train MLP and MiniGPT with each wrapper on N ranks and print the differences from one process."""
    args = cli_args.lab_arguments(argv, "ddp_lab", main.__doc__, steps=10, batch_size=DDPRun().batch_size)
    runs = [DDPRun(model=m, optimizer=o, wrapper=w, steps=args.steps)
            for m in ("mlp", "gpt") for o in OPTIMIZERS for w in WRAPPERS]
    rows = launch.run(compare_all_on_rank, runs, world_size=args.world_size)[0]
    if launch.is_reporting_process():
        print(say("title", args.lang, ranks=args.world_size, steps=args.steps))
        for row in rows:
            print(say("row", args.lang, model=row["model"], optimizer=row["optimizer"],
                      wrapper=row["wrapper"], identical=row["ranks_identical"],
                      param_diff=row["max_param_diff"], loss_diff=row["max_loss_diff"],
                      first=row["first_loss"], last=row["last_loss"]))
    return 0 if all(row["ranks_identical"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
