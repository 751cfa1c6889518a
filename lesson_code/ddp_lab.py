"""Rank functions of lesson 77: train with our DDP wrappers or torch DDP, and time each phase.

The notebook, the tests and the benchmark run these through `launch.spawn` (or torchrun) and
compare with `train_single_process`, one process on the full batch. A `DDPRun` (a frozen
`experiment.RunConfig`) says what to train; the timing is `lesson_code.experiment`'s.
The model of a bucketed backward (`overlap_model`, `bucket_sweep`, `ModelledCluster`) is plain
arithmetic, with no ranks: the lesson compares it with the stored benchmark and runs it for a cluster.
The exercises' code, and the side demonstrations of no_sync() and of the two bucket rules, are in
`lesson_code.ddp_exercises`.

    python -m lesson_code.ddp_lab          # 4 ranks: our wrappers and torch DDP vs one process
    python -m lesson_code.ddp_lab --lang fa  # the same, reported in Persian
"""

from __future__ import annotations

import socket
import time
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
from lesson_code.experiment import RunConfig, flat_parameters, global_mean, train
from lesson_code.harness.timing import PhaseClock
from lesson_code.models import GPTConfig, MiniGPT, build_model
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


def make_optimizer(run: DDPRun, params) -> torch.optim.Optimizer:
    """The torch.optim optimizer `run.optimizer` names, at its learning rate in OPTIMIZERS."""
    optimizer_class, lr = OPTIMIZERS[run.optimizer]
    return optimizer_class(params, lr=lr)


def train_single_process(run: DDPRun) -> dict:
    """The reference: one process, the full batch, plain torch.optim (no wrapper, no accumulation).

    Runs in a group of one: compute it with `reference.in_one_rank`, so that it also runs with the
    ranks' thread count. Returns the final parameters (float64) and the loss of each step."""
    model = build_model(run.model, run.seed, run.gpt, current_device())
    losses = train(lambda step: model(*run.batch(step))[1], make_optimizer(run, model.parameters()),
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
    """This rank's loss of `step` over `run.accumulation` micro-batches, for the caller's backward,
    whose value is the slice's mean loss: the earlier micro-batches' losses are added detached."""
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
    """Train with `run.wrapper` on this rank's slice; return final parameters and the losses
    averaged over ranks. Collective: every rank. Models start from seed + rank: only the
    wrapper's broadcast makes them agree."""
    model = wrap(run, build_model(run.model, run.seed + rank, run.gpt, current_device()))
    optimizer = make_optimizer(run, model.parameters())
    losses = []
    for step in range(run.steps):
        optimizer.zero_grad()
        loss = accumulated_loss(run, model, step, rank, world_size)  # on this rank's slice
        loss.backward()  # returns once .grad holds the average over the ranks
        optimizer.step()  # the same step on every rank
        losses.append(global_mean(loss))
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


def timed_phases(model: nn.Module, optimizer, batch: tuple[torch.Tensor, ...]) -> dict[str, float]:
    """Seconds of one training step of `model` on `batch`, by phase. Collective: every rank.

    forward (zero_grad and the loss), backward, optimizer and step, as `timed_step` times them.
    Our wrappers also report wait (communication left after backward), check (the ranks'
    one-number check that no gradient is missing, and BucketedDDP's copy back into .grad) and
    comm (the all-reduce calls' durations added up, ring only: a call also lasts while it waits
    for slower ranks to reach it); both wait and check happen at the end of
    backward, so they are taken out of backward here, which leaves its computation. torch DDP
    keeps no such record: for it these are NaN and backward includes whatever it waited for.
    """
    clock = PhaseClock()
    timed_step(clock, optimizer, lambda: model(*batch)[1])
    phases = {name: values[-1] for name, values in clock.samples.items()}
    stats = getattr(model, "stats", None)
    if stats is None:
        return {**phases, "wait": float("nan"), "check": float("nan"), "comm": float("nan")}
    phases["backward"] -= stats["wait_s"] + stats["finish_s"]
    return {**phases, "wait": stats["wait_s"], "check": stats["finish_s"], "comm": stats["comm_s"]}


def time_variants(rank: int, world_size: int, runs: list[DDPRun], rounds: int, steps: int,
                  warmup: int = 2) -> list[list[list[dict[str, float]]]]:
    """`timed_phases` of `steps` steps of every run in `runs`, in `rounds` rounds in alternation.

    Collective: call on every rank. Each run gets its own model (from `run.seed`) and optimizer,
    built once, and `warmup` untimed steps. Then every round times `steps` steps of each run,
    round k starting with run k mod len(runs), so that every run is timed at every place in the
    order, and load from other work on the machine falls on all runs alike instead of on
    whichever ran during it. Returns samples[run][round] = that round's steps, each a dict of
    seconds per phase, of this rank.
    """
    require_positive_int("rounds", rounds)
    require_positive_int("steps", steps)
    models = [wrap(run, build_model(run.model, run.seed, run.gpt, current_device()),
                   record_events=True) for run in runs]
    optimizers = [make_optimizer(run, model.parameters()) for run, model in zip(runs, models)]
    taken = [0] * len(runs)  # steps taken by each run: the index of its next batch

    def step(index: int) -> dict[str, float]:
        batch = runs[index].local_batch(taken[index], rank, world_size)  # before the clock
        taken[index] += 1
        return timed_phases(models[index], optimizers[index], batch)

    for index in range(len(runs)):
        for _ in range(warmup):
            step(index)
    samples: list[list[list[dict]]] = [[] for _ in runs]
    for round_index in range(rounds):
        first = round_index % len(runs)
        for index in [*range(first, len(runs)), *range(first)]:
            samples[index].append([step(index) for _ in range(steps)])
    for model in models:
        if isinstance(model, (NaiveDDP, BucketedDDP)):
            model.comm.close()
    return samples


def overlap_timeline(rank: int, world_size: int, run: DDPRun) -> dict:
    """Measured events of one bucketed step (after a warm-up) of every rank, on one clock.

    Collective: call on every rank. Returns forward, backward, wait and check spans (as
    `timed_phases` names them) and, per bucket, when its last gradient arrived and when its ring
    all-reduce ran: seconds since the earliest rank began the step, so that the ranks' times can
    be compared and subtracted (the step's last wait end less its last backward end is its
    exposed communication). That needs one clock for all ranks: the times are time.perf_counter
    readings, CLOCK_MONOTONIC on Linux, one clock for every process of a machine, and a rank that
    leaves the step's barrier later starts later. Raises ValueError when the ranks run on more
    than one host, whose clocks this function does not align."""
    hosts: list = [None] * world_size
    dist.all_gather_object(hosts, socket.gethostname())
    if len(set(hosts)) > 1:
        raise ValueError(f"overlap_timeline needs every rank on one machine, to read one clock; "
                         f"the ranks run on {sorted(set(hosts))}, whose clocks it does not align")
    run = replace(run, wrapper="bucketed", comm="ring")
    model = wrap(run, build_model(run.model, run.seed, run.gpt, current_device()), record_events=True)
    optimizer = make_optimizer(run, model.parameters())
    clock = PhaseClock()
    for step in range(2):
        batch = run.local_batch(step, rank, world_size)
        began = timed_step(clock, optimizer, lambda: model(*batch)[1])
    earliest = torch.tensor([began], dtype=torch.float64, device=current_device())
    dist.all_reduce(earliest, op=dist.ReduceOp.MIN)  # the earliest rank's start
    origin = earliest.item()
    start = began - origin  # this rank's start on the shared clock, 0 for the earliest
    forward, backward = clock.samples["forward"][-1], clock.samples["backward"][-1]
    waited = forward + backward - model.stats["finish_s"]  # the check and copy-back follow
    computed = waited - model.stats["wait_s"]  # when backward's own work ended
    buckets = [{key: (value - origin if key in ("ready", "start", "end") else value)
                for key, value in row.items()} for row in model.timeline]
    return {"forward": (start, start + forward), "backward": (start + forward, start + computed),
            "wait": (start + computed, start + waited),
            "check": (start + waited, start + forward + backward), "buckets": buckets}


def overlap_model(sizes: list[int], bucket_cap_mb: float, backward_s: float, alpha: float,
                  beta: float, world_size: int, work: list[float] | None = None) -> dict:
    """A model of one bucketed backward pass, which lesson 77's explorer draws.

    `sizes` are the gradients' bytes in the order backward produces them (reverse registration
    order, as BucketedDDP sees them). `work[i]` is the backward's work (floating-point
    operations, `backward_work`) between gradient i-1 and gradient i: gradient i is ready once
    the backward has spent that share of `backward_s` (without `work`, a share proportional to
    the bytes so far). Buckets are cut as BucketedDDP cuts them (`bucket_groups`, `bucket_cap_mb`
    in MiB); each bucket's all-reduce starts when its last gradient is ready and the previous
    all-reduce has finished, and lasts the ring's alpha-beta time (`cost_model.predict`).
    Returns {"buckets": [{"bytes", "ready", "start", "end"}], "backward_s", "exposed_s"}: exposed
    is the communication still running after the backward ended, the wait the step pays. The
    backward runs as fast as alone: communication has hardware of its own.
    """
    work = sizes if work is None else work
    total, done, ready_at = sum(work), 0.0, []
    for amount in work:
        done += amount
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


def backward_work(config: GPTConfig, sequences: int, attention: bool = True) -> list[float]:
    """Floating-point operations of a MiniGPT's backward on `sequences` full-length sequences,
    per gradient, in `gradient_sizes` order: what the backward computes before that gradient.

    A Linear weight of shape (out, in) costs 4 * out * in per token (the gradients of its input
    and of its weight, each a matmul of 2 * out * in per token); the attention's own matmuls
    (scores and their product with the values, 4 * T * C per token forward, twice that
    backward, the full T x T square) are counted with the qkv weight, whose gradient follows
    them; `attention=False` leaves them out, to show how much they weigh. Everything else is
    a sum over tokens, one addition per element: an embedding's gradient is a scatter-add of
    the output's gradient into the rows of the tokens seen (`tokens * C`), and a bias's or a
    LayerNorm's a sum over the tokens. Elementwise work (GELU, softmax) is left out.
    """
    tokens, T, C = sequences * config.context, config.context, config.n_embd
    with torch.device("meta"):
        model = MiniGPT(config)
    modules = dict(model.named_modules())
    work = []
    for name, param in reversed(list(model.named_parameters())):
        owner = modules[name.rsplit(".", 1)[0]]
        if isinstance(owner, nn.Linear) and name.endswith("weight"):
            flops = 4 * param.numel() * tokens
            if attention and name.endswith("attn.qkv.weight"):
                flops += 2 * 4 * T * C * tokens
        elif isinstance(owner, nn.Embedding):
            flops = tokens * C
        else:
            flops = tokens * param.numel()
        work.append(float(flops))
    return work


@dataclass(frozen=True)
class ModelledCluster:
    """The cluster lesson 77 models (nothing here is measured): overlap_model's inputs for a
    MiniGPT of GPT-2 small's shape, data parallel over `world_size` GPUs in as many nodes.

    Constants, each an assumption named in the lesson: one GPU per node, so that every step of
    the ring crosses the network; one 200 Gb/s InfiniBand link per GPU (`bandwidth`, 25 GB/s);
    a latency of `alpha_s` = 15 us per ring step, an optimistic value: NCCL 2.30's tuning model
    (src/graph/tuning.cc: a ring all-reduce across nodes costs a base 8.4 us plus 14.0 us per
    network step, 8.4 + 6 * 14.0 = 92 us on 4 nodes, times 1.4 on an A100 or newer for large
    messages, as every bucket here is) charges 129 us, about 22 us per step;
    `sequences` of `gpt.context` tokens per GPU; the backward's floating-point operations
    (`backward_work`) at `flops_per_s`, 125 TFLOP/s (40% of an A100's 312 TFLOP/s bf16 peak);
    gradients are float32, as DDP reduces them under bf16 autocast; `attention` as in
    `backward_work`.
    """

    gpt: GPTConfig = field(default_factory=lambda: GPTConfig(
        vocab_size=50257, context=1024, n_layer=12, n_embd=768, n_head=12))
    world_size: int = 4
    sequences: int = 8
    alpha_s: float = 15e-6
    bandwidth: float = 25e9        # bytes per second
    flops_per_s: float = 125e12
    attention: bool = True         # count the attention's matmuls in the backward

    def inputs(self) -> dict:
        """overlap_model's inputs: {"sizes", "work", "backward_s", "alpha", "beta", "world_size"}."""
        work = backward_work(self.gpt, self.sequences, self.attention)
        return {"sizes": gradient_sizes(self.gpt), "work": work, "world_size": self.world_size,
                "backward_s": sum(work) / self.flops_per_s, "alpha": self.alpha_s,
                "beta": 1 / self.bandwidth}


def communication_ratio(inputs: dict) -> float:
    """The all-reduce of every gradient at once (ring, alpha-beta) over the backward's time, for
    `inputs` as ModelledCluster.inputs returns them. Below 1, buckets can hide all the
    communication but the last bucket's behind the backward; above 1, at least (ratio - 1)
    times the backward stays exposed, whatever the bucket size."""
    whole = cost_model.predict("all_reduce", sum(inputs["sizes"]), inputs["world_size"],
                               inputs["alpha"], inputs["beta"])
    return whole / inputs["backward_s"]


def bucket_sweep(inputs: dict, bucket_mbs: list[float]) -> list[dict]:
    """overlap_model at each bucket size of `bucket_mbs` (MiB) for `inputs` (a dict as
    ModelledCluster.inputs returns; "work" optional): buckets, the communication left after the
    backward, and the backward plus that exposed part, the share of the step the bucket size
    changes (ms)."""
    rows = []
    for mb in bucket_mbs:
        model = overlap_model(inputs["sizes"], mb, inputs["backward_s"], inputs["alpha"],
                              inputs["beta"], inputs["world_size"], inputs.get("work"))
        rows.append({"bucket MiB": mb, "buckets": len(model["buckets"]),
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


def each_run(rank: int, world_size: int, fn: Callable, runs: list, *args) -> list:
    """`fn(rank, world_size, run, *args)` for each of `runs`, in order, in one process group.

    Collective: call on every rank. One start of the ranks serves several runs (starting ranks
    costs more than a small run), e.g. `launch.spawn(each_run, train_ranks, runs)`.
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
    """For each run: do the ranks agree, and how far are they from one process on the full batch
    (`max_param_diff`) and from torch DDP on the same run (`max_param_diff_vs_torch`)?

    Collective: call on every rank; each process also trains the single-process reference, and
    torch DDP once for each run it is compared with (the same run with wrapper "torch").
    """
    trained: dict[DDPRun, dict] = {}

    def train_once(run: DDPRun) -> dict:
        if run not in trained:
            trained[run] = train_ranks(rank, world_size, run)
        return trained[run]

    rows = []
    for run in runs:
        reference = train_single_process(replace(run, accumulation=1))
        result = train_once(run)
        torch_ddp = train_once(replace(run, wrapper="torch"))
        params = [torch.empty_like(result["params"]) for _ in range(world_size)]
        dist.all_gather(params, result["params"])
        rows.append({
            "model": run.model, "optimizer": run.optimizer, "wrapper": run.wrapper,
            "accumulation": run.accumulation,
            "ranks_identical": all(torch.equal(p, params[0]) for p in params),
            "max_param_diff": (result["params"] - reference["params"]).abs().max().item(),
            "max_param_diff_vs_torch": (result["params"] - torch_ddp["params"]).abs().max().item(),
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
                  "{param_diff:.1e} (vs torch DDP {torch_diff:.1e})  max |loss diff| {loss_diff:.1e}  "
                  "loss {first:.3f} -> {last:.3f}",
           "gradients": "gradients: {mib:.1f} MiB per rank ({mb:.1f} MB)",
           "auto": "auto's choice for a {mb:g} MiB bucket on {ranks} ranks, from lesson 76's stored "
                   "times: {algorithm}",
           "fit": "ring all-reduce fitted to these times: α = {alpha_us:.0f} µs per message, "
                  "1/β = {gbps:.2f} GB/s",
           "cluster": "modelled cluster: a MiniGPT of GPT-2 small's shape, {parameters:,} "
                      "parameters, {mib:.0f} MiB of float32 gradients, a backward of "
                      "{backward_ms:.1f} ms on each of {ranks} GPUs; the all-reduce of every "
                      "gradient at once takes {ratio:.2f} times the backward",
           "ratio parts": "the same ratio with the backward counting the weights' matmuls "
                          "alone: {weights:.2f}; with the attention's matmuls too: {ratio:.2f}",
           "step parts": "modelled step on each GPU: forward {forward_ms:.1f} ms, backward "
                         "{backward_ms:.1f} ms, Adam's step {optimizer_ms:.1f} ms, plus the "
                         "exposed communication",
           "nodes of 8": "{ranks} GPUs in nodes of 8 at NCCL's modelled latency, {latency_us:.0f} µs "
                         "per all-reduce: exposed communication {exposed_ms:.1f} ms, efficiency "
                         "{efficiency:.2f}",
           "exposed": "the step's exposed communication (last wait end - last backward end, "
                      "on one clock for all ranks): {ms:.1f} ms\nranks whose first all-reduce "
                      "started before their own backward ended: {inside} of {ranks}"},
    "fa": {"title": "درس ۷۷: آموزش با موازی‌سازی داده روی {ranks} رتبه در برابر یک فرایند، {steps} گام",
           "row": "  {model} {optimizer} {wrapper}: رتبه‌ها یکسان: {identical}، بیشینهٔ |اختلاف پارامتر| "
                  "{param_diff:.1e} (با DDP در PyTorch {torch_diff:.1e})، بیشینهٔ |اختلاف زیان| "
                  "{loss_diff:.1e}، زیان از {first:.3f} به {last:.3f}",
           "gradients": "گرادیان‌ها: {mib:.1f} MiB در هر رتبه ({mb:.1f} MB)",
           "auto": "انتخاب `auto` برای باکتی {mb:g} MiB روی {ranks} رتبه، از زمان‌های "
                   "ذخیره‌شدهٔ درس ۷۶: `{algorithm}`",
           "fit": "کاهش همگانی حلقه‌ای، برازش‌شده به این زمان‌ها: α برابر {alpha_us:.0f} µs برای "
                  "هر پیام، پهنای باند `1/β` برابر {gbps:.2f} GB/s",
           "cluster": "خوشهٔ مدل‌شده: یک MiniGPT به شکل GPT-2 کوچک، {parameters:,} پارامتر، "
                      "{mib:.0f} MiB گرادیان float32، گذر برگشتی {backward_ms:.1f} میلی‌ثانیه‌ای "
                      "روی هر یک از {ranks} GPU؛ کاهش همگانی همهٔ گرادیان‌ها با هم {ratio:.2f} "
                      "برابر گذر برگشت طول می‌کشد",
           "ratio parts": "همین نسبت اگر گذر برگشت فقط ضرب‌های ماتریسیِ وزن‌ها را بشمارد: "
                          "{weights:.2f}؛ با ضرب‌های ماتریسیِ توجه هم: {ratio:.2f}",
           "step parts": "گام مدل‌شده روی هر GPU: گذر رفت {forward_ms:.1f} میلی‌ثانیه، گذر برگشت "
                         "{backward_ms:.1f} میلی‌ثانیه، گام Adam {optimizer_ms:.1f} میلی‌ثانیه، "
                         "به‌اضافهٔ ارتباط پنهان‌نشده",
           "nodes of 8": "روی {ranks} GPU در گره‌های ۸تایی، با تأخیر مدل‌شدهٔ NCCL، {latency_us:.0f} µs "
                         "برای هر کاهش همگانی: ارتباط پنهان‌نشده {exposed_ms:.1f} میلی‌ثانیه، "
                         "کارایی مقیاس‌پذیری {efficiency:.2f}",
           "exposed": "ارتباط پنهان‌نشدهٔ گام (آخرین پایان انتظار منهای آخرین پایان گذر برگشت، "
                      "با یک زمان‌سنج برای همهٔ رتبه‌ها): {ms:.1f} میلی‌ثانیه\nرتبه‌هایی که نخستین "
                      "کاهش همگانی‌شان پیش از پایانِ گذر برگشتِ خودشان آغاز شد: {inside} از {ranks}"},
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
                      param_diff=row["max_param_diff"], torch_diff=row["max_param_diff_vs_torch"],
                      loss_diff=row["max_loss_diff"],
                      first=row["first_loss"], last=row["last_loss"]))
    return 0 if all(row["ranks_identical"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
