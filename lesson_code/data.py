"""Deterministic data for every lesson: the same batch on every rank and in every process.

Lessons 77-80 train on `make_batch`: a batch depends only on (seed, step), so a run on N ranks,
each taking its slice with `torch.tensor_split(batch, N)[rank]`, sees exactly the data one
process sees on the whole batch. The capstone (lesson 81) reads text: `make_corpus` draws a
token stream from a Markov chain, and `batch_for_step` cuts each step's windows out of it.

    x, y = make_batch("gpt", batch_size=16, step=3, seed=0)
    x, y = batch_for_step(make_corpus(0, 272), step=3, rank=1, world_size=4, batch_per_rank=4,
                          context=16)
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


FOLLOW_PROBABILITY = 0.9  # how often a token of the corpus is followed by its likely successor


def make_corpus(seed: int, total_tokens: int, vocab_size: int = 64) -> torch.Tensor:
    """A 1-D int64 tensor of `total_tokens` tokens from a seeded Markov chain the model can learn.

    Each token has one likely successor (chosen from the seed) which follows it 90% of the time;
    otherwise the next token is uniform. A model that learns the table drives the loss towards
    the chain's entropy, about 0.73 nats (a uniform guess scores ln(64) = 4.16), so the loss
    visibly falls.
    Raises ValueError for fewer than 2 tokens or a vocabulary smaller than 2.
    """
    if total_tokens < 2 or vocab_size < 2:
        raise ValueError(f"need total_tokens >= 2 and vocab_size >= 2, got {total_tokens}, "
                         f"{vocab_size}: pass at least 2 of each")
    generator = torch.Generator().manual_seed(seed)
    successor = torch.randperm(vocab_size, generator=generator)
    follow = torch.rand(total_tokens, generator=generator) < FOLLOW_PROBABILITY
    noise = torch.randint(0, vocab_size, (total_tokens,), generator=generator)
    successor, follow, noise = successor.tolist(), follow.tolist(), noise.tolist()
    tokens = [noise[0]]
    for i in range(1, total_tokens):  # plain ints: a chain of 100k tokens takes milliseconds
        tokens.append(successor[tokens[-1]] if follow[i] else noise[i])
    return torch.tensor(tokens, dtype=torch.int64)


def batch_for_step(corpus: torch.Tensor, step: int, rank: int, world_size: int,
                   batch_per_rank: int, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's (inputs, targets) for `step`: (batch_per_rank, context) each, on the CPU.

    The global batch is world_size * batch_per_rank consecutive windows of context + 1 tokens,
    starting at a cursor that advances with the step and wraps round the corpus; rank r takes
    windows r * batch_per_rank .. (r + 1) * batch_per_rank - 1, which is
    `tensor_split(global batch, world_size)[r]`. The step is the data position. Raises
    ValueError when the corpus holds fewer windows than one step needs.
    """
    window = context + 1
    per_step = world_size * batch_per_rank * window
    count = corpus.numel() // window
    if count < world_size * batch_per_rank:
        raise ValueError(f"a corpus of {corpus.numel()} tokens holds {count} windows of "
                         f"{window}; one step needs {world_size * batch_per_rank}: make it larger")
    first = (step * per_step // window) % count
    rows = [(first + rank * batch_per_rank + i) % count for i in range(batch_per_rank)]
    windows = torch.stack([corpus[row * window: (row + 1) * window] for row in rows])
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()  # (B, T), (B, T)
