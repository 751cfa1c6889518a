"""Practice for lesson 78: the learner's ZeRO stage 1 optimizer and its flat parameter helpers.

The learner writes `flatten_params`, `unflatten_into` and `ZeroOptimizer(model, world_size, rank,
lr, betas, eps, group)` with `step()` and `zero_grad()`, to the course's layout
(`lesson_code.zero`): the flat parameters padded with zeros to a multiple of N, shard r the r-th
of N equal slices, an fp32 master shard and Adam's two moments of that length (`master`,
`exp_avg`, `exp_avg_sq`). The checks train an MLP of 6922 parameters (not divisible by 3, 4 or
5) in groups of 1 to 5 ranks against torch.optim.Adam on the full batch and torch's
ZeroRedundancyOptimizer, train a bfloat16 model against the course's unsharded fp32-master Adam,
read the optimizer's state bytes from storage, and count the bytes a step puts on the wire.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from lesson_code.experiment import flat_parameters
from lesson_code.models import MLP
from lesson_code.practice.grading import Check, Failure, Lesson, load_learner, run_ranks
from lesson_code.practice.lessons.ddp_support import (BFLOAT16_RELATIVE, ZERO_BOUND,
                                                      counted_collectives, over_world_sizes,
                                                      parameter_at, prefix_group_phrase,
                                                      prefix_groups, relative_distance,
                                                      train_in_group, value_failure, within)
from lesson_code.practice.messages import listing, phrase
from lesson_code.practice.rank_checks import during
from lesson_code.practice.timing import Timing, paired_rounds
from lesson_code.zero import ZeroOptimizer as CourseZeroOptimizer
from lesson_code.zero import storage_bytes
from lesson_code.zero_lab import ZeroRun, run_loss, run_model, train_single_process

NAMES = ("flatten_params", "unflatten_into", "ZeroOptimizer")
STEPS = 4
# 60 samples split equally over 1 to 5 ranks; the MLP's 6922 parameters need padding for 3, 4, 5.
RUN = ZeroRun(model="mlp", steps=STEPS, batch_size=60)
STATE = ("master", "exp_avg", "exp_avg_sq")
FLAT_PARAMETERS = phrase("the flat parameters", "پارامترهای تخت")


def _optimizer(learner, model, size: int, rank: int, group, lr: float):
    """The learner's ZeroOptimizer over `group` (None: every rank)."""
    if group is None:
        return learner.ZeroOptimizer(model, size, rank, lr)
    return learner.ZeroOptimizer(model, size, rank, lr, group=group)


def grade_flatten(rank: int, world_size: int, path: str) -> list[Failure]:
    """Rank function: flatten_params is parameters_to_vector; unflatten_into writes in place."""
    learner = load_learner(path)
    failures = []
    for index, dtype in enumerate((torch.float32, torch.bfloat16)):
        model = MLP().to(dtype)
        params = list(model.parameters())
        dtype_name = str(dtype).replace("torch.", "")
        case = phrase("flatten_params of an MLP in {dtype}", "`flatten_params` روی یک MLP با {dtype}",
                      dtype=dtype_name)
        with during(case):
            flat = learner.flatten_params(model)
        found = within(flat, torch.nn.utils.parameters_to_vector(params).detach(), None,
                       case=case, case_index=2 * index, rank=rank,
                       reference="parameters_to_vector(model.parameters())",
                       element_of=parameter_at(model, phrase("the flat vector", "بردار تخت")))
        new = torch.randn(flat.numel(), dtype=torch.float32)
        written = new.clone()
        case = phrase("unflatten_into an MLP in {dtype} from a float32 vector, then the vector "
                      "changed", "`unflatten_into` روی یک MLP با {dtype} از یک بردار float32، و "
                      "سپس تغییر آن بردار", dtype=dtype_name)
        with during(case):
            learner.unflatten_into(model, new)
        new.add_(1.0)  # the model must not see this: unflatten_into copies
        got = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
        same = all(a is b for a, b in zip(params, model.parameters()))
        found = found or (None if same else value_failure(
            phrase("the parameters after unflatten_into", "پارامترها پس از `unflatten_into`"),
            phrase("new torch.nn.Parameter objects", "شیءهای `torch.nn.Parameter` تازه"),
            phrase("the same ones, written in place", "همان شیءها، که درجا نوشته شوند"),
            case=case, case_index=2 * index + 1, rank=rank))
        found = found or within(
            got, written.to(dtype), None, rank=rank, case_index=2 * index + 1, case=case,
            reference=phrase("the vector's values, cast to the model's dtype",
                             "مقدارهای بردار، تبدیل‌شده به نوع دادهٔ مدل"),
            element_of=parameter_at(model, FLAT_PARAMETERS))
        failures += [found] if found else []
    return failures


def train_learner(rank: int, size: int, group, learner, run: ZeroRun) -> tuple[dict, object]:
    """Train `run` on this rank's slice with the learner's ZeroOptimizer inside `group`."""
    model = run_model(run)
    optimizer = _optimizer(learner, model, size, rank, group, run.lr)
    losses = train_in_group(lambda step: run_loss(run, model, step, rank, size), optimizer,
                            run.steps, group)
    return {"params": flat_parameters(model), "losses": losses, "model": model}, optimizer


def train_torch_zero(rank: int, size: int, group, run: ZeroRun) -> dict:
    """Train `run` with torch's DDP and ZeroRedundancyOptimizer (Adam) inside `group`."""
    # Imported here: torch.distributed.optim imports TorchScript, which warns on import.
    from torch.distributed.optim import ZeroRedundancyOptimizer

    model = run_model(run)
    wrapped = DistributedDataParallel(model, process_group=group)
    optimizer = ZeroRedundancyOptimizer(wrapped.parameters(), optimizer_class=torch.optim.Adam,
                                        process_group=group, lr=run.lr)
    losses = train_in_group(lambda step: run_loss(run, wrapped, step, rank, size), optimizer,
                            run.steps, group)
    return {"params": flat_parameters(model), "losses": losses}


def grade_training(rank: int, world_size: int, path: str) -> list[Failure]:
    """Rank function: in groups of 1 to `world_size` ranks, the learner's ZeRO-1 trains as
    torch.optim.Adam on the full batch (and, on the most ranks, as ZeroRedundancyOptimizer).
    The learner's runs come first, so that an optimizer that raises ends the check at once."""
    learner = load_learner(path)
    groups = prefix_groups(world_size)
    results = {}
    for size, group in groups.items():
        if rank < size:
            with during(_training_case(size, world_size)):
                results[size] = train_learner(rank, size, group, learner, RUN)[0]
    single = train_single_process(RUN)  # every rank together, once the groups are done
    torch_zero = train_torch_zero(rank, world_size, groups[world_size], RUN)
    failures = []
    for size, group in groups.items():
        if rank >= size:
            continue
        result = results[size]
        where = {"case": _training_case(size, world_size), "case_index": size, "rank": rank,
                 "element_of": parameter_at(run_model(RUN), FLAT_PARAMETERS)}
        gathered = [torch.empty_like(result["params"]) for _ in range(size)]
        dist.all_gather(gathered, result["params"], group=group)
        references = [(phrase("torch.optim.Adam in one process on the full batch",
                              "`torch.optim.Adam` در یک فرایند روی کل دسته"), single)]
        if size == world_size:
            references.append((phrase("torch's ZeroRedundancyOptimizer",
                                      "ZeroRedundancyOptimizer خود torch"), torch_zero))
        found = [within(result["params"], gathered[0], None, **where,
                        reference=phrase("rank {zero}'s parameters", "پارامترهای رتبهٔ {zero}",
                                         zero=0))]
        found += [within(result["params"], reference["params"], ZERO_BOUND, reference=name,
                         **where) for name, reference in references]
        failures += [failure for failure in found if failure is not None][:1]
    return failures


def _training_case(size: int, world_size: int):
    return phrase("{group}, ZeroOptimizer with Adam lr={lr}, {steps} steps",
                  "{group}، ZeroOptimizer با Adam و `lr={lr}`، {steps} گام",
                  group=prefix_group_phrase(size, world_size), lr=str(RUN.lr), steps=STEPS)


def grade_bfloat16(rank: int, world_size: int, path: str) -> list[Failure]:
    """Rank function: a bfloat16 model keeps an fp32 master shard, trains as the course's
    unsharded fp32-master Adam, and holds the gathered master rounded to bfloat16."""
    learner = load_learner(path)
    run = replace(RUN, dtype="bfloat16")
    single = train_single_process(run)  # lesson_code.zero.MasterAdam on the full batch
    case = phrase("an MLP in bfloat16, all {n} ranks, {steps} steps",
                  "یک MLP با bfloat16، همهٔ {n} رتبه، {steps} گام", n=world_size, steps=STEPS)
    with during(case):
        result, optimizer = train_learner(rank, world_size, None, learner, run)
    where = {"case": case, "rank": rank}
    master = getattr(optimizer, "master", None)
    if not isinstance(master, torch.Tensor) or master.dtype != torch.float32:
        return [value_failure("optimizer.master", getattr(master, "dtype", master),
                              phrase("a torch.float32 tensor (the master shard)",
                                     "تنسوری از نوع `torch.float32` (شارد وزن‌های اصلی)"),
                              case_index=0, **where)]
    model_dtype = {p.dtype for p in result["model"].parameters()}
    if model_dtype != {torch.bfloat16}:
        return [value_failure(phrase("the dtypes of the model's parameters",
                                     "نوع دادهٔ پارامترهای مدل"),
                              sorted(map(str, model_dtype)),
                              phrase("torch.bfloat16 (the model keeps its dtype)",
                                     "`torch.bfloat16` (مدل نوع داده‌اش را نگه می‌دارد)"),
                              case_index=1, **where)]
    shards = [torch.empty_like(master) for _ in range(world_size)]
    dist.all_gather(shards, master.contiguous())
    numel = result["params"].numel()
    found = within(result["params"], torch.cat(shards)[:numel].to(torch.bfloat16).double(), None,
                   reference=phrase("the ranks' master shards, concatenated, rounded to bfloat16",
                                    "شاردهای وزن‌های اصلی رتبه‌ها، پشت هم، گردشده به bfloat16"),
                   element_of=parameter_at(result["model"], FLAT_PARAMETERS), case_index=2,
                   **where)
    start = flat_parameters(run_model(run))
    distance = relative_distance(result["params"], single["params"], start)
    if found is None and not distance < BFLOAT16_RELATIVE:
        found = value_failure(
            phrase("the distance ||params - reference|| / ||reference - start|| from MasterAdam "
                   "on the full batch", "فاصلهٔ `||params - reference|| / ||reference - start||` "
                   "از MasterAdam روی کل دسته"),
            round(distance, 3), phrase("below {bound}", "کمتر از {bound}", bound=BFLOAT16_RELATIVE),
            case_index=3, **where)
    return [found] if found else []


def grade_memory(rank: int, world_size: int, path: str) -> list[Failure]:
    """Rank function: master, exp_avg and exp_avg_sq hold 12 bytes per padded shard element."""
    learner = load_learner(path)
    numel = sum(p.numel() for p in run_model(RUN).parameters())
    case = phrase("an MLP of {numel} parameters, all {n} ranks, after one step",
                  "یک MLP با {numel} پارامتر، همهٔ {n} رتبه، پس از یک گام",
                  numel=numel, n=world_size)
    with during(case):
        result, optimizer = train_learner(rank, world_size, None, learner, replace(RUN, steps=1))
    shard = math.ceil(numel / world_size)
    missing = [name for name in STATE
               if not isinstance(getattr(optimizer, name, None), torch.Tensor)]
    if missing:
        return [value_failure(f"optimizer.{missing[0]}", repr(getattr(optimizer, missing[0], None)),
                              phrase("a tensor", "یک تنسور"), case=case, case_index=0, rank=rank)]
    storages = {getattr(optimizer, name).untyped_storage().data_ptr(): getattr(optimizer, name)
                for name in STATE}  # each storage once
    held = storage_bytes(*storages.values())
    if held != 12 * shard:
        return [value_failure(
            phrase("the bytes of optimizer.master, .exp_avg and .exp_avg_sq, read from their "
                   "storage", "بایت‌های `optimizer.master` و `.exp_avg` و `.exp_avg_sq`، خوانده از "
                   "حافظهٔ خودشان"), held,
            phrase("{bytes} = {k} x ceil({numel} / {n})", "`{bytes} = {k} × ceil({numel} / {n})`",
                   bytes=12 * shard, k=12, numel=numel, n=world_size),
            case=case, case_index=0, rank=rank)]
    return []


def grade_bytes(rank: int, world_size: int, path: str) -> list[Failure]:
    """Rank function: one step sends a reduce-scatter plus an all-gather of the padded gradient."""
    learner = load_learner(path)
    model = run_model(RUN)
    optimizer = _optimizer(learner, model, world_size, rank, None, RUN.lr)
    run_loss(RUN, model, 0, rank, world_size).backward()
    numel = sum(p.numel() for p in model.parameters())
    case = phrase("one step, {numel} float32 parameters, all {n} ranks",
                  "یک گام، {numel} پارامتر float32، همهٔ {n} رتبه", numel=numel, n=world_size)
    with during(case), counted_collectives() as calls:
        optimizer.step()
    shard_bytes = 4 * math.ceil(numel / world_size)
    sent = sum(call.sent for call in calls)
    if sent != 2 * (world_size - 1) * shard_bytes:
        listed = listing([phrase("{name} {bytes}", "`{name}` {bytes}", name=call.name,
                                 bytes=call.sent) for call in calls])
        return [Failure("bytes", {
            "case": phrase("{case} (bytes of each call: {listed})",
                           "{case} (بایت‌های هر فراخوانی: {listed})", case=case,
                           listed=listed if calls else phrase("none", "هیچ")),
            "case_index": 0, "rank": rank, "got": sent,
            "expected": 2 * (world_size - 1) * shard_bytes,
            "expected_what": phrase("a reduce-scatter plus an all-gather of the padded gradient",
                                    "یک کاهش و پخش به‌اضافهٔ یک گردآوری همگانیِ گرادیان "
                                    "پدینگ‌شده")})]
    return []


def time_step(rank: int, world_size: int, path: str) -> tuple[list[float], list[float]]:
    """Rank function: (learner's, course's) slowest-rank seconds of one optimizer step, per round."""
    learner = load_learner(path)
    run = replace(RUN, model="gpt", batch_size=16)
    steps = []
    for make in (lambda m: learner.ZeroOptimizer(m, world_size, rank, run.lr),
                 lambda m: CourseZeroOptimizer(m, world_size, rank, run.lr, comm="builtin")):
        model = run_model(run)
        steps.append(make(model).step)
        run_loss(run, model, 0, rank, world_size).backward()
    return paired_rounds(*steps)


def timing(path: str, timeout_s: float) -> Timing:
    """The learner's ZeroOptimizer.step against the course's (built-in collectives), 4 ranks."""
    yours, course = run_ranks(time_step, path, world_size=4, timeout_s=timeout_s,
                              case="timing")[0]
    return Timing(phrase("ZeroOptimizer.step on MiniGPT", "`ZeroOptimizer.step` روی MiniGPT"), 4,
                  tuple(yours), tuple(course))


CHECKS = (
    Check("flatten",
          {"en": "flatten_params concatenates the parameters; unflatten_into writes them back in place",
           "fa": "`flatten_params` پارامترها را پشت هم می‌گذارد و `unflatten_into` آن‌ها را درجا بازمی‌نویسد"},
          {"en": "copy each slice into its parameter (param.copy_ under torch.no_grad()), which also "
                 "casts the dtype; vector_to_parameters would make the parameters views of the vector",
           "fa": "هر تکه را در پارامتر خودش بنویسید (`param.copy_` زیر `torch.no_grad()`)، که نوع داده "
                 "را هم تبدیل می‌کند؛ `vector_to_parameters` پارامترها را نمایی از بردار می‌کند"},
          over_world_sizes(grade_flatten, world_sizes=(1,)),
          needs=("flatten_params", "unflatten_into")),
    Check("training",
          {"en": "ZeRO-1 trains as torch.optim.Adam on the full batch, 1 to 5 ranks (with padding)",
           "fa": "ZeRO-1 مانند `torch.optim.Adam` روی کل دسته آموزش می‌دهد، ۱ تا ۵ رتبه (با پدینگ)"},
          {"en": "pad the flat gradient with zeros to N x ceil(P / N), reduce-scatter it and divide "
                 "by N, run Adam with bias correction on your shard, all-gather the shards and drop "
                 "the padding; pass group= to every collective",
           "fa": "گرادیان تخت را با صفر تا `N × ceil(P / N)` پدینگ کنید، آن را کاهش و پخش کنید و "
                 "بر N تقسیم کنید، Adam را با تصحیح سوگیری روی شارد خود اجرا کنید، شاردها را "
                 "گردآوری همگانی کنید و پدینگ را دور بریزید؛ `group=` را به هر عملیات جمعی بدهید"},
          over_world_sizes(grade_training, world_sizes=(5,), groups=True),
          needs=("ZeroOptimizer",)),
    Check("bfloat16",
          {"en": "a bfloat16 model keeps an fp32 master shard and trains as fp32-master Adam",
           "fa": "مدل bfloat16 شاردی از وزن‌های اصلی fp32 نگه می‌دارد و مانند Adam با وزن‌های "
                 "اصلی fp32 آموزش می‌بیند"},
          {"en": "make self.master a float32 copy of your shard, run Adam on it, and all-gather "
                 "it cast to the model's dtype",
           "fa": "`self.master` را رونوشتی float32 از شارد خود بسازید، Adam را روی آن اجرا کنید و "
                 "آن را، تبدیل‌شده به نوع دادهٔ مدل، گردآوری همگانی کنید"},
          over_world_sizes(grade_bfloat16, world_sizes=(3,)), needs=("ZeroOptimizer",)),
    Check("memory",
          {"en": "optimizer state per rank is 12 bytes per shard element (12 x ceil(P / N))",
           "fa": "وضعیت بهینه‌ساز هر رتبه ۱۲ بایت به ازای هر عنصر شارد است (۱۲ × `ceil(P / N)`)"},
          {"en": "self.master, self.exp_avg and self.exp_avg_sq are fp32 tensors of the shard's "
                 "length: clone the shard, or it stays a view of the whole flat vector (and keeps "
                 "it alive)",
           "fa": "`self.master` و `self.exp_avg` و `self.exp_avg_sq` تنسورهای fp32 به طول شاردند: از شارد "
                 "با `clone()` رونوشت بگیرید، وگرنه نمایی از کل بردار تخت می‌ماند (و آن را زنده نگه "
                 "می‌دارد)"},
          over_world_sizes(grade_memory, world_sizes=(4,)), needs=("ZeroOptimizer",)),
    Check("bytes",
          {"en": "a step sends a reduce-scatter plus an all-gather: the bytes of one DDP all-reduce",
           "fa": "هر گام یک کاهش و پخش و یک گردآوری همگانی می‌فرستد: به اندازهٔ یک کاهش همگانی در "
                 "DDP"},
          {"en": "reduce-scatter the gradient (each rank receives only its shard) instead of "
                 "all-reducing all of it and slicing",
           "fa": "گرادیان را کاهش و پخش کنید (هر رتبه فقط شارد خود را می‌گیرد)، نه اینکه همه را "
                 "کاهش همگانی کنید و شارد خود را جدا کنید"},
          over_world_sizes(grade_bytes, world_sizes=(4,)), needs=("ZeroOptimizer",)),
)

LESSON = Lesson(78, "my_zero.py", NAMES, CHECKS, timing)
