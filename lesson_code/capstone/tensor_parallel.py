"""Lesson 81a: MiniGPT's attention heads split over 2 ranks (tensor parallelism).

Megatron-LM's split of self-attention: each rank computes the query, key and value projections
of its own heads only (the rows of the qkv weight that belong to them, "column parallel"), runs
attention on those heads, and multiplies their output by its columns of the output projection
("row parallel"). The ranks' partial outputs are summed by one all-reduce per block, which gives
exactly the unsplit attention output. Everything else is computed whole on every rank.

For the backward pass the split needs Megatron-LM's two conjugate operators: `f` before the
column-parallel projection (identity forward, all-reduce of the gradient backward) and `g` after
the row-parallel one (all-reduce forward, identity backward). `tensor_parallel_gradients` trains
through them and `single_rank_gradients` is its reference; `wrong_g=True` uses PyTorch's
differentiable all-reduce for `g` instead, whose backward all-reduces the gradient again.

    launch.spawn(tensor_parallel_loss, CapstoneConfig(), world_size=2)  # == the one-rank loss
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed import _functional_collectives as funcol

from lesson_code.capstone.config import CapstoneConfig
from lesson_code.data import batch_for_step
from lesson_code.runtime.devices import current_device
from lesson_code.models import Block, MiniGPT


class CopyToTensorParallel(torch.autograd.Function):
    """Megatron-LM's `f`: the identity forward; backward, the sum of every rank's gradient of the
    input, since each rank's heads contribute only a part of it. Collective in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        return grad


class ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron-LM's `g`: the all-reduce forward; backward, the identity, since every rank already
    holds the whole gradient of the summed output. Collective in forward."""

    @staticmethod
    def forward(ctx, partial: torch.Tensor) -> torch.Tensor:
        total = partial.contiguous().clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad


def sharded_attention(block: Block, x: torch.Tensor, rank: int, world_size: int,
                      wrong_g: bool = False) -> torch.Tensor:
    """This rank's heads of `block.attn` applied to `x`, summed over ranks by an all-reduce.

    Collective: call on every rank. Shapes: x (B, T, C) -> (B, T, C). Differentiable through `f`
    and `g`; `wrong_g` sums with `funcol.all_reduce`, whose backward sums the gradient again.
    """
    attn = block.attn
    x = CopyToTensorParallel.apply(x)                            # f
    B, T, C = x.shape
    heads = attn.n_head // world_size
    hs = C // attn.n_head
    mine = slice(rank * heads * hs, (rank + 1) * heads * hs)  # this rank's channels of q, k, v
    weight, bias = attn.qkv.weight, attn.qkv.bias                # (3C, C), (3C,)
    q, k, v = (F.linear(x, weight[part * C:(part + 1) * C][mine], bias[part * C:(part + 1) * C][mine])
               for part in range(3))                             # 3 x (B, T, heads * hs)
    q, k, v = (t.view(B, T, heads, hs).transpose(1, 2) for t in (q, k, v))  # (B, heads, T, hs)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(hs)          # (B, heads, T, T)
    scores = scores.masked_fill(~attn.mask[:, :, :T, :T], float("-inf"))
    y = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, heads * hs)
    partial = F.linear(y, attn.proj.weight[:, mine])            # (B, T, C), no bias yet
    if wrong_g:
        return funcol.all_reduce(partial, "sum", dist.group.WORLD) + attn.proj.bias
    return ReduceFromTensorParallel.apply(partial) + attn.proj.bias  # g: sum of every rank's heads


def tensor_parallel_loss(rank: int, world_size: int, config: CapstoneConfig) -> float:
    """The loss of the first global batch with attention split over `world_size` ranks.

    Collective: call on every rank; every rank builds the same model from the seed and returns
    the same loss. Raises ValueError unless the number of heads divides evenly over the ranks.
    """
    _check_heads(config, world_size)
    model, x, y = _model_and_first_batch(config)
    with torch.no_grad():
        return _split_loss(model, x, y, rank, world_size).item()


def tensor_parallel_gradients(rank: int, world_size: int, config: CapstoneConfig,
                              wrong_g: bool = False) -> torch.Tensor:
    """The flat gradient of the first batch's loss, trained through the split attention.

    Collective: call on every rank. Raises ValueError unless the heads divide over the ranks.
    Each rank's gradient of the qkv rows and proj columns it does not own is zero; one all-reduce
    of those weights' gradients joins the slices, so every rank returns the whole gradient, to
    compare with `single_rank_gradients`.
    """
    _check_heads(config, world_size)
    model, x, y = _model_and_first_batch(config)
    _split_loss(model, x, y, rank, world_size, wrong_g).backward()
    for block in model.blocks:
        for sliced in (block.attn.qkv.weight, block.attn.qkv.bias, block.attn.proj.weight):
            dist.all_reduce(sliced.grad)                         # disjoint slices: the sum joins them
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).cpu()


def single_rank_gradients(config: CapstoneConfig) -> torch.Tensor:
    """The flat gradient of the same loss for the unsplit model in one process (the reference)."""
    model, x, y = _model_and_first_batch(config)
    model(x, y)[1].backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).cpu()


def _split_loss(model: MiniGPT, x, y, rank: int, world_size: int, wrong_g: bool = False):
    """MiniGPT's loss with every block's attention split over the ranks (MiniGPT.forward's path)."""
    h = model.embed(x)
    for block in model.blocks:
        h = h + sharded_attention(block, block.ln1(h), rank, world_size, wrong_g)
        h = h + block.mlp(block.ln2(h))
    logits = model.head(h)
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), y.reshape(-1))


def single_rank_loss(config: CapstoneConfig) -> float:
    """The same loss computed by the unsplit model in one process (the reference).

    Compute it with `reference.in_one_rank`, so that it runs with the ranks' thread count.
    """
    model, x, y = _model_and_first_batch(config)
    with torch.no_grad():
        return model(x, y)[1].item()


def _check_heads(config: CapstoneConfig, world_size: int) -> None:
    if config.gpt.n_head % world_size:
        raise ValueError(f"{config.gpt.n_head} heads cannot be split over {world_size} ranks: "
                         "use a world size that divides the number of heads")


def _model_and_first_batch(config: CapstoneConfig):
    """The model from the seed and the first batch, on this process's device."""
    torch.manual_seed(config.seed)
    model = MiniGPT(config.gpt).to(current_device())
    x, y = batch_for_step(config.corpus(), 0, 0, 1, config.batch_per_rank, config.gpt.context)
    return model, x.to(current_device()), y.to(current_device())
