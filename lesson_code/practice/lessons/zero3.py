"""Practice for lesson 78a: ZeRO-3's gather before a unit runs, and its free after.

The learner writes `ShardedUnit(module, world_size, rank, group)` with `gather()`, `free()` and
`attach()`, to the course's layout (`lesson_code.zero3`): a unit's trainable parameters in one
flat buffer `full`, padded with zeros to N * ceil(P / N) elements in the model's dtype, of which
the rank keeps its chunk `shard`; between uses `full` holds no bytes and every parameter is an
empty tensor. `attach()` registers the hooks that gather before the unit's forward, free after it,
and gather again before the unit's backward. Gradients are left in `.grad` (the reduce-scatter
is stage 2's, graded in lesson 78's practice). The checks shard one layer and then every layer
of an MLP (6922 parameters: its layers of 4160 and 650 need padding on 3 ranks) and of a small
MiniGPT, and compare what the ranks compute with the same model unsharded, in the same process:
the same operations on the same values, so outputs and gradients must be equal to the last bit.
Once every check passes, the learner's gather() and free() of a MiniGPT block are timed against
the course's (`CourseUnit`).
"""

from __future__ import annotations

import math
from functools import partial

import torch

from lesson_code.collectives.comm import Communicator
from lesson_code.models import GPTConfig, MiniGPT
from lesson_code.practice.grading import Check, Failure, Lesson, load_learner, run_ranks
from lesson_code.practice.lessons.ddp_support import (counted_collectives, over_world_sizes,
                                                      value_failure, within)
from lesson_code.practice.messages import listing, phrase
from lesson_code.practice.rank_checks import during
from lesson_code.practice.timing import Timing, paired_rounds
from lesson_code.zero2 import ShardedGroup
from lesson_code.zero3 import Zero3Optimizer, default_units
from lesson_code.zero_lab import ZeroRun, run_loss, run_model

NAMES = ("ShardedUnit",)
MODELS = {"mlp": ZeroRun(model="mlp", batch_size=12), "gpt": ZeroRun(model="gpt", batch_size=6)}
LAYER = (7, 5)  # a Linear of 7 x 5 + 5 = 40 parameters: ceil(40 / 3) = 14, padded to 42


class CourseUnit(Zero3Optimizer):
    """The exercise's ShardedUnit made of the course's own pieces: `zero3.Zero3Optimizer`'s
    gather, free and forward hooks on one unit, one of stage 2's `ShardedGroup`s. Built without
    the optimizer's own constructor, so it has no master copy and none of stage 2's gradient
    hooks: gradients stay in .grad, as the exercise asks. What the learner's file is timed
    against; the practice tests check that it passes every check."""

    def __init__(self, module, world_size: int, rank: int, group=None, comm: str = "ring"):
        self.module, self.world_size, self.rank = module, world_size, rank
        self.comm = Communicator(comm, group=group)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.unit = ShardedGroup("unit", self.params, world_size, 0)
        self.unit.full = self.unit.flatten(self.params).detach()
        self.unit.shard = self._own_chunk(self.unit, self.unit.full).clone()
        self.full, self.shard = self.unit.full, self.unit.shard
        self.free()

    def gather(self) -> None:
        self._gather(self.unit, "forward")

    def free(self) -> None:
        self._free(self.unit, "forward")

    def attach(self) -> None:
        self.module.register_forward_pre_hook(partial(self._before_forward, self.unit))
        self.module.register_forward_hook(partial(self._after_forward, self.unit))


def _unit(learner, module, world_size: int, rank: int):
    return learner.ShardedUnit(module, world_size, rank)


def held_bytes(tensor) -> int | None:
    """Bytes of `tensor`'s storage (None when it is not a tensor)."""
    return tensor.untyped_storage().nbytes() if isinstance(tensor, torch.Tensor) else None


def grade_shard(rank: int, world_size: int, path: str) -> list[Failure]:
    """Rank function: a Linear layer sharded keeps this rank's padded chunk, as its own tensor,
    and nothing else: `full` holds no bytes and each parameter is empty."""
    learner = load_learner(path)
    failures = []
    for index, dtype in enumerate((torch.float32, torch.bfloat16)):
        torch.manual_seed(0)
        layer = torch.nn.Linear(*LAYER).to(dtype)
        flat = torch.cat([p.detach().reshape(-1) for p in layer.parameters()])
        shard_numel = math.ceil(flat.numel() / world_size)
        padded = torch.cat([flat, flat.new_zeros(shard_numel * world_size - flat.numel())])
        expected = padded[rank * shard_numel: (rank + 1) * shard_numel]
        case = phrase("ShardedUnit of a Linear({inputs}, {outputs}) in {dtype}, all {n} ranks",
                      "ShardedUnit روی یک `Linear({inputs}, {outputs})` با `{dtype}`، همهٔ {n} رتبه",
                      inputs=LAYER[0], outputs=LAYER[1], dtype=str(dtype).replace("torch.", ""),
                      n=world_size)
        where = {"case": case, "case_index": index, "rank": rank}
        with during(case):
            unit = _unit(learner, layer, world_size, rank)
        shard = getattr(unit, "shard", None)
        found = None
        own_bytes = shard_numel * expected.element_size()
        if isinstance(shard, torch.Tensor) and held_bytes(shard) != own_bytes:
            # checked first: the values of a view whose storage was freed cannot be read
            found = value_failure(
                phrase("the bytes of self.shard's storage", "بایت‌های حافظهٔ `self.shard`"),
                held_bytes(shard), phrase("{bytes}: a tensor of its own, not a view of self.full",
                                          "{bytes}: تنسوری جداگانه، نه نمایی از `self.full`",
                                          bytes=own_bytes), **where)
        found = found or within(shard, expected, None, **where,
                                reference=phrase("this rank's chunk of the padded flat parameters",
                                                 "تکهٔ این رتبه از پارامترهای تخت پدینگ‌شده"))
        if found is None and held_bytes(getattr(unit, "full", None)) != 0:
            found = value_failure(phrase("the bytes of self.full's storage after construction",
                                         "بایت‌های حافظهٔ `self.full` پس از ساخت"),
                                  held_bytes(getattr(unit, "full", None)), 0, **where)
        sizes = [p.numel() for p in layer.parameters()]
        if found is None and any(sizes):
            found = value_failure(phrase("the parameters' sizes after construction",
                                         "اندازهٔ پارامترها پس از ساخت"), sizes, [0, 0], **where)
        failures += [found] if found else []
    return failures


def grade_gather(rank: int, world_size: int, path: str) -> list[Failure]:
    """Rank function: gather() gives every parameter its whole value back with one all-gather
    of the shards, free() leaves no bytes, and a second gather() gives the values again."""
    learner = load_learner(path)
    torch.manual_seed(0)
    layer = torch.nn.Linear(*LAYER)
    originals = [p.detach().clone() for p in layer.parameters()]
    case = phrase("ShardedUnit of a Linear({inputs}, {outputs}), gather, free, gather, all {n} "
                  "ranks", "ShardedUnit روی یک `Linear({inputs}, {outputs})`، گردآوری همگانی، "
                  "آزادسازی، گردآوری همگانی، همهٔ {n} رتبه", inputs=LAYER[0], outputs=LAYER[1],
                  n=world_size)
    where = {"case": case, "rank": rank}
    with during(case):
        unit = _unit(learner, layer, world_size, rank)
        with counted_collectives() as calls:
            unit.gather()
    shard_bytes = 4 * math.ceil(sum(p.numel() for p in originals) / world_size)
    found = _parameters_equal(layer, originals, case_index=0, **where)
    sent = sum(call.sent for call in calls)
    if found is None and sent != (world_size - 1) * shard_bytes:
        found = Failure("bytes", {
            **where, "case_index": 1, "got": sent, "expected": (world_size - 1) * shard_bytes,
            "case": phrase("{case} (bytes of each call: {listed})",
                           "{case} (بایت‌های هر فراخوانی: {listed})", case=case,
                           listed=listing([phrase("{name} {bytes}", "`{name}` {bytes}",
                                                  name=call.name, bytes=call.sent)
                                           for call in calls]) if calls else
                           phrase("none", "هیچ")),
            "expected_what": phrase("one all-gather of the shards",
                                    "یک گردآوری همگانیِ شاردها")})
    if found is None:
        with during(case):
            unit.free()
        if held_bytes(unit.full) != 0 or any(p.numel() for p in layer.parameters()):
            found = value_failure(
                phrase("the bytes of self.full and the parameters' sizes after free()",
                       "بایت‌های `self.full` و اندازهٔ پارامترها پس از `free()`"),
                [held_bytes(unit.full), *(p.numel() for p in layer.parameters())], [0, 0, 0],
                case_index=2, **where)
    if found is None:
        with during(case):
            unit.gather()
        found = _parameters_equal(layer, originals, case_index=3, **where)
    return [found] if found else []


def _parameters_equal(layer, originals, **where) -> Failure | None:
    """The first parameter of `layer` that is not exactly its original value, as a Failure."""
    for param, original in zip(layer.parameters(), originals):
        found = within(param.detach(), original, None, **where,
                       reference=phrase("the parameter before sharding",
                                        "همان پارامتر پیش از شاردبندی"))
        if found:
            return found
    return None


def _sharded_model(learner, kind: str, world_size: int, rank: int):
    """(model with every unit sharded and attached, its units, the same model unsharded)."""
    run = MODELS[kind]
    model, reference = run_model(run), run_model(run)
    units = [_unit(learner, module, world_size, rank) for module in default_units(model)]
    for unit in units:
        unit.attach()
    return model, units, reference


def _case(kind: str, world_size: int, what):
    name = "MiniGPT" if kind == "gpt" else "MLP"
    return phrase("{what}, {model} with every layer a ShardedUnit, all {n} ranks",
                  "{what}، {model} با هر لایه یک ShardedUnit، همهٔ {n} رتبه", what=what,
                  model=name, n=world_size)


def grade_forward(rank: int, world_size: int, path: str) -> list[Failure]:
    """Rank function: with the hooks attached, a forward pass gives the unsharded model's output
    bit for bit, with each unit gathered only while it runs and freed after it."""
    learner = load_learner(path)
    failures = []
    for index, kind in enumerate(MODELS):
        case = _case(kind, world_size, phrase("forward", "گذر رفت"))
        where = {"case": case, "rank": rank}
        with during(case):
            model, units, reference = _sharded_model(learner, kind, world_size, rank)
        seen: list[tuple[int, list[int | None]]] = []  # (unit, bytes every unit holds) at its hooks
        for position, unit in enumerate(units):
            unit.module.register_forward_pre_hook(
                lambda *_, position=position: seen.append(
                    (position, [held_bytes(u.full) for u in units])))
            unit.module.register_forward_hook(
                lambda *_, position=position: seen.append(
                    (position, [held_bytes(u.full) for u in units])))
        x, _ = MODELS[kind].local_batch(0, rank, world_size)
        with during(case):
            got = model(x)[0].detach()
        found = None
        for step, (position, held) in enumerate(seen):
            entering = step % 2 == 0
            wrong = [i for i, nbytes in enumerate(held) if bool(nbytes) != (entering and i == position)]
            if wrong:
                layer = type(units[wrong[0]].module).__name__  # code: Linear, Block
                found = value_failure(
                    phrase("the bytes of self.full of layer {index} (`{name}`) {when} layer {at}",
                           "بایت‌های `self.full` لایهٔ {index} (`{name}`) {when} لایهٔ {at}",
                           index=wrong[0], at=position, name=layer,
                           when=phrase("during the forward of", "در میانهٔ گذر رفت")
                           if entering else phrase("after the forward of", "پس از گذر رفت")),
                    held[wrong[0]], phrase("all of it while its own forward runs, else 0",
                                           "همه‌اش فقط وقتی گذر رفت خودش اجرا می‌شود، وگرنه ۰"),
                    case_index=2 * index, **where)
                break
        found = found or within(got, reference(x)[0].detach(), None, case_index=2 * index + 1,
                                reference=phrase("the same model unsharded", "همان مدل بدون شاردبندی"),
                                **where)
        failures += [found] if found else []
        if found:
            break
    return failures


def grade_backward(rank: int, world_size: int, path: str) -> list[Failure]:
    """Rank function: with the hooks attached, a forward and a backward pass leave in every
    parameter's .grad the unsharded model's gradient, bit for bit."""
    learner = load_learner(path)
    failures = []
    for index, kind in enumerate(MODELS):
        case = _case(kind, world_size, phrase("forward and backward", "گذر رفت و برگشت"))
        with during(case):
            model, units, reference = _sharded_model(learner, kind, world_size, rank)
            run_loss(MODELS[kind], model, 0, rank, world_size).backward()
        run_loss(MODELS[kind], reference, 0, rank, world_size).backward()
        for (name, param), theirs in zip(model.named_parameters(), reference.parameters()):
            got = param.grad if param.grad is not None else torch.zeros(0)
            found = within(got, theirs.grad, None, case=case, case_index=index, rank=rank,
                           reference=phrase("the gradient of {name} in the same model unsharded",
                                            "گرادیان `{name}` در همان مدل بدون شاردبندی", name=name))
            if found:
                failures.append(found)
                break
        if failures:
            break
    return failures


TIMED_BLOCK = GPTConfig(n_embd=128, n_head=4)  # blocks of 198,272 parameters, as in lesson 78a


def time_gather(rank: int, world_size: int, path: str) -> tuple[list[float], list[float]]:
    """Rank function: (learner's, course's) slowest-rank seconds of a gather() and a free() of a
    MiniGPT block, per round; the course's all-gathers with torch.distributed's built-in too."""
    learner = load_learner(path)
    units = [make(MiniGPT(TIMED_BLOCK).blocks[0], world_size, rank)
             for make in (learner.ShardedUnit, partial(CourseUnit, comm="builtin"))]
    calls = [lambda unit=unit: (unit.gather(), unit.free()) for unit in units]
    return paired_rounds(*calls)


def timing(path: str, timeout_s: float) -> Timing:
    """The learner's gather and free of a MiniGPT block against the course's, on 4 ranks."""
    yours, course = run_ranks(time_gather, path, world_size=4, timeout_s=timeout_s,
                              case="timing")[0]
    return Timing(phrase("gather() and free() of a MiniGPT block",
                         "`gather()` و `free()` روی یک بلوک MiniGPT"), 4, tuple(yours), tuple(course))


CHECKS = (
    Check("shard",
          {"en": "ShardedUnit keeps this rank's chunk of the padded flat parameters, and nothing else",
           "fa": "ShardedUnit فقط تکهٔ این رتبه از پارامترهای تخت پدینگ‌شده را نگه می‌دارد"},
          {"en": "concatenate the parameters, pad with zeros to N x ceil(P / N), clone() elements "
                 "[rank x shard_numel, (rank + 1) x shard_numel) as self.shard, then free(): a "
                 "slice without clone() is a view that dies with self.full's storage",
           "fa": "پارامترها را پشت هم بگذارید، با صفر تا `N × ceil(P / N)` پدینگ کنید، عنصرهای "
                 "`[rank × shard_numel, (rank + 1) × shard_numel)` را با `clone()` در `self.shard` "
                 "نگه دارید و سپس `free()` را فرا بخوانید: برشی بدون `clone()` نمایی است که با "
                 "حافظهٔ `self.full` از میان می‌رود"},
          over_world_sizes(grade_shard, world_sizes=(3,)), needs=("ShardedUnit",)),
    Check("gather",
          {"en": "gather() restores every parameter with one all-gather; free() leaves no bytes",
           "fa": "`gather()` هر پارامتر را با یک گردآوری همگانی برمی‌گرداند و `free()` هیچ بایتی "
                 "باقی نمی‌گذارد"},
          {"en": "resize self.full's storage back (untyped_storage().resize_), all-gather the "
                 "shards into it (dist.all_gather_single), and point each parameter at its "
                 "piece (param.data = a view); free() sets each param.data to an empty tensor and "
                 "resizes the storage to 0",
           "fa": "حافظهٔ `self.full` را به اندازهٔ پیشین برگردانید (`untyped_storage().resize_`)، "
                 "شاردها را در آن گردآوری همگانی کنید (`dist.all_gather_single`) و هر پارامتر "
                 "را به تکهٔ خودش اشاره دهید (`param.data` = یک نما)؛ `free()` هر `param.data` را تنسوری "
                 "خالی می‌کند و حافظه را به ۰ می‌رساند"},
          over_world_sizes(grade_gather, world_sizes=(3,)), needs=("ShardedUnit",)),
    Check("forward",
          {"en": "attach(): each layer is gathered only while its forward runs, and the output "
                 "is the unsharded model's",
           "fa": "`attach()`: هر لایه فقط وقتی گذر رفتش اجرا می‌شود گردآوری‌شده است، و خروجی همان "
                 "خروجی مدل بدون شاردبندی است"},
          {"en": "register_forward_pre_hook calls gather(); register_forward_hook calls free() "
                 "once the layer's output exists",
           "fa": "`register_forward_pre_hook` تابع `gather()` را فرا می‌خواند و `register_forward_hook`، "
                 "پس از ساخته شدن خروجی لایه، تابع `free()` را"},
          over_world_sizes(grade_forward, world_sizes=(3,)), needs=("ShardedUnit",)),
    Check("backward",
          {"en": "backward gathers each layer again: every gradient is the unsharded model's",
           "fa": "گذر برگشت هر لایه را دوباره گردآوری همگانی می‌کند: هر گرادیان همان گرادیان مدل "
                 "بدون شاردبندی است"},
          {"en": "in the forward hook, register on each output tensor that requires grad a hook "
                 "(tensor.register_hook) that calls gather(): backward calls it just before the "
                 "layer's own backward. Refill the same storage: autograd saved views of it",
           "fa": "در قلاب گذر رفت، روی هر تنسور خروجی که گرادیان لازم دارد قلابی ثبت کنید "
                 "(`tensor.register_hook`) که `gather()` را فرا بخواند: گذر برگشت آن را درست پیش از "
                 "گذر برگشت خود لایه فرا می‌خواند. همان حافظه را دوباره پر کنید: `autograd` "
                 "نماهایی از آن را نگه داشته است"},
          over_world_sizes(grade_backward, world_sizes=(3,)), needs=("ShardedUnit",)),
)

LESSON = Lesson("78a", "my_zero3.py", NAMES, CHECKS, timing)
