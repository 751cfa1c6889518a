"""Deterministic training batches for the lessons' models: the same batch on every rank and process.

A batch depends only on (seed, step), so a run on N ranks, each taking its slice with
`torch.tensor_split(batch, N)[rank]`, sees exactly the data one process sees on the whole batch.

    x, y = make_batch("gpt", batch_size=16, step=3, seed=0)
"""

from __future__ import annotations

import torch

from lesson_code.models import GPTConfig

MLP_FEATURES, MLP_CLASSES = 32, 10


def make_batch(model: str, batch_size: int, step: int, seed: int = 0,
               gpt: GPTConfig | None = None,
               device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of `step` for "mlp" (features, classes) or "gpt" (tokens, next tokens).

    MLP: 32 Gaussian features, class = index of the largest of the first 10 (learnable).
    GPT: uniform random tokens whose target is 3 * token + 1 mod vocab (learnable, every token
    appears as a target). The batch is drawn on the CPU, so it is the same on every device, then
    moved to `device`. Raises ValueError for another model name.
    """
    generator = torch.Generator().manual_seed(1_000_003 * seed + step)
    if model == "mlp":
        x = torch.randn(batch_size, MLP_FEATURES, generator=generator)
        return x.to(device), x[:, :MLP_CLASSES].argmax(dim=1).to(device)
    if model == "gpt":
        config = gpt or GPTConfig()
        idx = torch.randint(0, config.vocab_size, (batch_size, config.context), generator=generator)
        return idx.to(device), ((3 * idx + 1) % config.vocab_size).to(device)
    raise ValueError(f"unknown model {model!r}: use 'mlp' or 'gpt'")


def local_slice(batch: tuple[torch.Tensor, ...], rank: int, world_size: int) -> tuple[torch.Tensor, ...]:
    """This rank's slice of every tensor of `batch`: `torch.tensor_split(t, world_size)[rank]`."""
    return tuple(torch.tensor_split(t, world_size)[rank] for t in batch)
