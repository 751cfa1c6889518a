"""ZeRO stage 1 (lesson 78): each of N ranks keeps 1/N of Adam's state and of the fp32 master copy.

After backward, a reduce-scatter gives each rank the averaged gradient of its own shard only; the
rank runs Adam on that shard of the fp32 master weights; an all-gather then hands every rank the
whole updated model. Per step this moves exactly the bytes of DDP's one all-reduce, while the
optimizer's memory falls from 12 bytes per parameter to 12/N. `NaiveZeroOptimizer`, beside it,
all-reduces the whole gradient and slices, which costs half as much traffic again.

    optimizer = ZeroOptimizer(model, world_size, rank, lr=1e-3)   # inside a rank
    loss.backward(); optimizer.step(); optimizer.zero_grad()

The flat parameter buffer is padded with zeros to a multiple of N so that every shard has the same
length (`padding` says how many); lesson 80 strips the padding when it saves a checkpoint.
Stages 2 and 3, which also shard the gradients and then the parameters, build on this module:
`lesson_code.zero2` and `lesson_code.zero3`.
Run the lesson's demo: `python -m lesson_code.zero_lab` (4 ranks) or under torchrun.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from lesson_code.collectives.comm import Communicator
from lesson_code.collectives.ledger import CommLedger
from lesson_code.harness.validate import require_positive, require_positive_int


def flatten_params(module: nn.Module) -> torch.Tensor:
    """All trainable parameters of `module`, in registration order, as one new contiguous 1-D tensor.

    Raises ValueError when the module has no trainable parameter or mixes dtypes.
    """
    return nn.utils.parameters_to_vector(_trainable(module)).detach()


def unflatten_into(module: nn.Module, flat: torch.Tensor) -> None:
    """Write `flat` (as made by flatten_params) back into the parameters, in place, casting dtype.

    Raises ValueError when `flat` is not 1-D or its length differs from the parameter count.
    Copies rather than `nn.utils.vector_to_parameters`, which would make the parameters views of
    `flat` (sharing its memory and its dtype) instead of writing into them.
    """
    params = _trainable(module)
    total = sum(p.numel() for p in params)
    if flat.dim() != 1 or flat.numel() != total:
        raise ValueError(
            f"flat tensor of shape {tuple(flat.shape)} does not fit {type(module).__name__}: it "
            f"needs a 1-D tensor of {total} elements (strip any padding first: flat[:{total}])"
        )
    with torch.no_grad():
        for param, piece in zip(params, torch.split(flat, [p.numel() for p in params])):
            param.copy_(piece.view_as(param))


def flat_gradient(params: list[torch.Tensor]) -> torch.Tensor:
    """The gradients of `params`, in order, as one new 1-D tensor; RuntimeError if one is None."""
    missing = [i for i, p in enumerate(params) if p.grad is None]
    if missing:
        raise RuntimeError(f"{len(missing)} parameters have no gradient: call backward() on a "
                           "loss that uses every parameter before step()")
    return torch.cat([p.grad.reshape(-1) for p in params])


def clipped(grad: torch.Tensor, norm: float, max_norm: float) -> torch.Tensor:
    """`grad` scaled so that a gradient of norm `norm` ends at most `max_norm`, as
    torch.nn.utils.clip_grad_norm_ scales (by max_norm / (norm + 1e-6), only when below 1)."""
    coefficient = max_norm / (norm + 1e-6)
    return grad * coefficient if coefficient < 1 else grad


def storage_bytes(*tensors: torch.Tensor) -> int:
    """Bytes of the tensors' storage, read from memory (not computed from a formula)."""
    return sum(t.untyped_storage().nbytes() for t in tensors)


def trainable_parameters(module: nn.Module) -> list[torch.Tensor]:
    """The parameters that require grad; ValueError if there are none or they mix dtypes."""
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"{type(module).__name__} has no trainable parameters to flatten")
    dtypes = {p.dtype for p in params}
    if len(dtypes) > 1:
        raise ValueError(f"parameters mix dtypes {sorted(map(str, dtypes))}: cast the model to one "
                         "dtype (e.g. model.to(torch.bfloat16)) before sharding it")
    return params


_trainable = trainable_parameters  # the short name this module's code uses


def adam_update(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor,
                exp_avg_sq: torch.Tensor, step: int, lr: float, betas: tuple[float, float],
                eps: float, weight_decay: float) -> None:
    """One Adam step on fp32 tensors, in place, in torch.optim.Adam's order of operations.

    Weight decay is L2 (added to the gradient), as in torch.optim.Adam, not decoupled (AdamW).
    """
    beta1, beta2 = betas
    if weight_decay:
        grad = grad.add(param, alpha=weight_decay)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    step_size = lr / (1 - beta1 ** step)
    denominator = (exp_avg_sq.sqrt() / (1 - beta2 ** step) ** 0.5).add_(eps)
    param.addcdiv_(exp_avg, denominator, value=-step_size)


class ZeroOptimizer:
    """Adam with its state and fp32 master weights sharded over `world_size` ranks (ZeRO stage 1).

    Collective: construct and call `step()` on every rank. Model parameters may be float32 or
    bfloat16 (the master shard is always float32). `max_grad_norm` clips the global gradient norm
    as torch.nn.utils.clip_grad_norm_ would on the whole model (`track_grad_norm` computes it
    into `last_grad_norm` without clipping); `stage=2` also drops the full gradients after the
    reduce-scatter, keeping only this rank's shard (after backward has held them all: stage 2
    as it runs, during backward, is `lesson_code.zero2.Zero2Optimizer`). `comm` is "ring"
    (lesson 76, counted in `ledger`), "builtin", or a Communicator: `world_size` and `rank`
    must be its group's.
    Raises ValueError for a bad world size, rank, learning rate or stage, or a world size or rank
    other than the communicator's group's.
    """

    def __init__(self, model: nn.Module, world_size: int, rank: int, lr: float,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, *, max_grad_norm: float | None = None,
                 stage: int = 1, comm: Communicator | str = "ring",
                 ledger: CommLedger | None = None, track_grad_norm: bool = False):
        self.comm = comm if isinstance(comm, Communicator) else Communicator(comm, ledger)
        _check_arguments(self.comm, world_size, rank, lr, stage)
        self.track_grad_norm = track_grad_norm
        self.model, self.world_size, self.rank = model, world_size, rank
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.max_grad_norm, self.stage = max_grad_norm, stage
        self.params = _trainable(model)
        self.numel = sum(p.numel() for p in self.params)
        self.shard_numel = math.ceil(self.numel / world_size)
        self.padding = self.shard_numel * world_size - self.numel
        self.start = rank * self.shard_numel
        flat = self._padded(flatten_params(model).to(torch.float32))
        self.master = flat[self.start: self.start + self.shard_numel].clone()  # fp32, 4 B/element
        self.exp_avg = torch.zeros_like(self.master)                              # 4 B/element
        self.exp_avg_sq = torch.zeros_like(self.master)                           # 4 B/element
        self.grad_shard: torch.Tensor | None = None
        self.step_count = 0
        self.last_grad_norm: float | None = None

    def step(self) -> None:
        """Reduce-scatter the gradients, run Adam on this rank's shard, all-gather the parameters.

        Collective: call on every rank after backward. Raises RuntimeError if a parameter has no
        gradient (every rank must contribute to every shard).
        """
        grad = self._reduce_gradient(self._padded(flat_gradient(self.params)))  # (shard_numel,)
        self.grad_shard = grad
        if self.stage == 2:
            for param in self.params:
                param.grad = None  # keep only this rank's shard of the gradient
        grad = grad.to(torch.float32)
        if self.max_grad_norm is not None or self.track_grad_norm:
            self.last_grad_norm = self._global_norm(grad)
        if self.max_grad_norm is not None:
            grad = clipped(grad, self.last_grad_norm, self.max_grad_norm)
        self.step_count += 1
        adam_update(self.master, grad, self.exp_avg, self.exp_avg_sq, self.step_count, self.lr,
                    self.betas, self.eps, self.weight_decay)
        self._gather_parameters()

    def zero_grad(self) -> None:
        """Forget the gradients (set them to None, as torch optimizers do by default)."""
        for param in self.params:
            param.grad = None
        self.grad_shard = None

    def optimizer_state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds, read from the tensors' storage (not a formula)."""
        return storage_bytes(self.master, self.exp_avg, self.exp_avg_sq)

    def gradient_bytes(self) -> int:
        """Bytes of gradients this rank holds right now: full `.grad` tensors plus its shard."""
        grads = {p.grad.untyped_storage().data_ptr(): p.grad for p in self.params
                 if p.grad is not None}  # each storage once
        shard = [self.grad_shard] if self.grad_shard is not None else []
        return storage_bytes(*grads.values(), *shard)

    def state_dict(self) -> dict:
        """This rank's shard: step, fp32 master, both moments, and where the shard sits."""
        return {
            "step": self.step_count, "master": self.master.clone(),
            "exp_avg": self.exp_avg.clone(), "exp_avg_sq": self.exp_avg_sq.clone(),
            "shard": {"rank": self.rank, "world_size": self.world_size, "start": self.start,
                      "numel": self.numel, "shard_numel": self.shard_numel,
                      "padding": self.padding},
            "hyperparameters": {"lr": self.lr, "betas": list(self.betas), "eps": self.eps,
                                "weight_decay": self.weight_decay},
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a shard saved by `state_dict` on the same rank of the same world size.

        Also writes the master shard into the model (after an all-gather), so parameters and
        optimizer agree. Collective: call on every rank. Raises ValueError for another layout.
        """
        expected = {"rank": self.rank, "world_size": self.world_size, "numel": self.numel,
                    "shard_numel": self.shard_numel}
        found = {key: state["shard"].get(key) for key in expected}
        if found != expected:
            raise ValueError(f"optimizer shard {found} does not match this rank {expected}: load "
                             "the shard saved by this rank, or reshard the checkpoint (lesson 80)")
        self.step_count = int(state["step"])
        for name in ("master", "exp_avg", "exp_avg_sq"):
            getattr(self, name).copy_(state[name])
        self._gather_parameters()

    def _gather_parameters(self) -> None:
        """All-gather every rank's master shard, in the model's dtype, into the model."""
        sizes = [self.shard_numel] * self.world_size
        full = self.comm.all_gather(self.master.to(self.params[0].dtype), sizes)  # numel + padding
        unflatten_into(self.model, full[: self.numel])

    def _padded(self, flat: torch.Tensor) -> torch.Tensor:
        return torch.cat([flat, flat.new_zeros(self.padding)]) if self.padding else flat

    def _reduce_gradient(self, flat_grad: torch.Tensor) -> torch.Tensor:
        """This rank's shard of the averaged gradient: one reduce-scatter."""
        return self.comm.reduce_scatter(flat_grad, op="avg")

    def _global_norm(self, grad: torch.Tensor) -> float:
        """The L2 norm of the whole averaged gradient, from this rank's shard of it.

        The square root of the all-reduced sum of each shard's squared norm: what
        clip_grad_norm_ computes on the whole model (padding is zero, so it adds nothing).
        """
        squared = grad.pow(2).sum().reshape(1)
        self.comm.all_reduce(squared, op="sum")
        return squared.sqrt().item()


class MasterAdam:
    """Unsharded mixed-precision Adam: the whole fp32 master copy and both moments on this rank.

    What every rank holds under plain DDP (12 bytes per parameter), and the single-process
    reference for bfloat16 models. Gradients must already be averaged (by DDP, or one process).
    """

    def __init__(self, model: nn.Module, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, max_grad_norm: float | None = None):
        self.model, self.params = model, _trainable(model)
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.max_grad_norm = max_grad_norm
        self.master = flatten_params(model).to(torch.float32)
        self.exp_avg, self.exp_avg_sq = torch.zeros_like(self.master), torch.zeros_like(self.master)
        self.step_count = 0

    def step(self) -> None:
        """Adam on the whole fp32 master copy, then the master written into the model."""
        grad = flat_gradient(self.params).to(torch.float32)
        if self.max_grad_norm is not None:
            grad = clipped(grad, grad.norm().item(), self.max_grad_norm)
        self.step_count += 1
        adam_update(self.master, grad, self.exp_avg, self.exp_avg_sq, self.step_count, self.lr,
                    self.betas, self.eps, self.weight_decay)
        unflatten_into(self.model, self.master)

    def zero_grad(self) -> None:
        """Forget the gradients (set them to None)."""
        for param in self.params:
            param.grad = None

    def optimizer_state_bytes(self) -> int:
        """Bytes of master copy and moments, read from storage."""
        return storage_bytes(self.master, self.exp_avg, self.exp_avg_sq)


class NaiveZeroOptimizer(ZeroOptimizer):
    """ZeRO-1 with an all-reduce of the whole gradient, then a slice: correct, but more traffic.

    Each rank receives the whole reduced gradient and throws away (N-1)/N of it, so a step moves
    3(N-1)/N of the gradient bytes per rank instead of 2(N-1)/N.
    """

    def _reduce_gradient(self, flat_grad: torch.Tensor) -> torch.Tensor:
        self.comm.all_reduce(flat_grad, op="avg")
        return flat_grad[self.start: self.start + self.shard_numel].clone()


def _check_arguments(comm: Communicator, world_size: int, rank: int, lr: float, stage: int):
    """`check_shard_arguments`, and ValueError for a stage ZeroOptimizer does not run."""
    if stage not in (1, 2):
        raise ValueError(f"stage={stage!r} is not supported here: use 1 (optimizer state) or 2 "
                         "(also gradients, dropped in step()); for stages 2 and 3 as they run, "
                         "use lesson_code.zero2.Zero2Optimizer or lesson_code.zero3.Zero3Optimizer")
    check_shard_arguments(comm, world_size, rank, lr)


def check_shard_arguments(comm: Communicator, world_size: int, rank: int, lr: float) -> None:
    """Raise ValueError for a world size, rank or learning rate a sharded optimizer cannot use.

    `world_size` and `rank` must also be the communicator's group's: the shard layout comes from
    them and the messages go to the group, so a mismatch would exchange shards of other lengths.
    """
    require_positive_int("world_size", world_size, "the number of ranks that share the state")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank!r} is not in 0..{world_size - 1} for world_size={world_size}")
    require_positive("lr", lr, "a learning rate such as 1e-3")
    if (comm.world_size, comm.rank) != (world_size, rank):
        raise ValueError(
            f"world_size={world_size}, rank={rank} disagree with the communicator's group, which "
            f"has world_size={comm.world_size} and this process as rank={comm.rank}: pass "
            "world_size=comm.world_size and rank=comm.rank (or a Communicator over the group "
            "you mean)")
