"""Models shared by the lessons: a 3-layer MLP and MiniGPT, a tiny decoder-only transformer.

Lessons 77-81 train these on several ranks and compare with a single process, so both are fully
deterministic given a seed (no dropout). MiniGPT is laid out as embedding, blocks, head, the three
pieces lesson 79 cuts into pipeline stages. Imports nothing from the package.

    python -c "from lesson_code.models import MiniGPT, GPTConfig; print(MiniGPT(GPTConfig()))"
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    """Linear-ReLU-Linear-ReLU-Linear classifier; `forward(x, targets)` returns (logits, loss)."""

    def __init__(self, in_features: int = 32, hidden: int = 64, out_features: int = 10):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(in_features, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, out_features),
        )

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None):
        logits = self.layers(x)  # (B, out_features)
        loss = None if targets is None else F.cross_entropy(logits, targets)
        return logits, loss


@dataclass(frozen=True)
class GPTConfig:
    """MiniGPT's shape; the defaults are lesson 81's capstone model (vary with dataclasses.replace)."""

    vocab_size: int = 64
    context: int = 16
    n_layer: int = 2
    n_embd: int = 32
    n_head: int = 4

    def __post_init__(self):
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        for name in ("vocab_size", "context", "n_layer", "n_embd", "n_head"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


class CausalSelfAttention(nn.Module):
    """Masked multi-head self-attention: position t attends to positions <= t only."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)
        mask = torch.tril(torch.ones(config.context, config.context, dtype=torch.bool))
        self.register_buffer("mask", mask.view(1, 1, config.context, config.context),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.qkv(x).split(C, dim=2)            # 3 x (B, T, C)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(hs)  # (B, nh, T, T)
        scores = scores.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
        y = scores.softmax(dim=-1) @ v                     # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)   # (B, T, C)
        return self.proj(y)


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.n_embd)
        self.mlp = nn.Sequential(nn.Linear(config.n_embd, 4 * config.n_embd), nn.GELU(),
                                 nn.Linear(4 * config.n_embd, config.n_embd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Embedding(nn.Module):
    """Token plus learned position embeddings: (B, T) token ids -> (B, T, C)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.context = config.context
        self.tokens = nn.Embedding(config.vocab_size, config.n_embd)
        self.positions = nn.Embedding(config.context, config.n_embd)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        if T > self.context:
            raise ValueError(f"sequence length {T} exceeds the model's context {self.context}")
        positions = torch.arange(T, device=idx.device)
        return self.tokens(idx) + self.positions(positions)  # (B, T, C)


class Head(nn.Module):
    """Final LayerNorm and the language-model head (its own weights, not tied to the embedding)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln(x))  # (B, T, vocab)


class MiniGPT(nn.Module):
    """Decoder-only transformer; `forward(idx, targets)` returns (logits, mean cross-entropy)."""

    def __init__(self, config: GPTConfig = GPTConfig()):
        super().__init__()
        self.config = config
        self.embed = Embedding(config)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.head = Head(config)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        logits = self.head(x)  # (B, T, vocab)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss


def as_layers(model: nn.Module) -> list[nn.Module]:
    """The model as a list of modules applied in sequence (what pipeline stages are cut from).

    MLP: its Linear and ReLU layers; MiniGPT: embedding, each block, head. Applying them in order
    gives the model's output (logits); the loss is applied after the last one.
    """
    if isinstance(model, MLP):
        return list(model.layers)
    if isinstance(model, MiniGPT):
        return [model.embed, *model.blocks, model.head]
    raise ValueError(f"no layer list for {type(model).__name__}: use an MLP or a MiniGPT")


def loss_function(kind: str):
    """The loss of model kind "mlp" or "gpt" as a function of (its last layer's output, targets).

    Pipeline stages apply it after the last stage; the loss of a whole model is `model(x, y)[1]`.
    """
    if kind == "gpt":
        return lambda logits, targets: F.cross_entropy(logits.view(-1, logits.shape[-1]),
                                                       targets.reshape(-1))
    if kind == "mlp":
        return F.cross_entropy
    raise ValueError(f"unknown model kind {kind!r}: use 'mlp' or 'gpt'")


def gpt_parameters(config: GPTConfig) -> int:
    """MiniGPT's parameter count from its shape, without building it (V vocabulary, T context,
    L blocks of width C): the embeddings VC + TC, per block 12C^2 + 13C (attention 4C^2 + 4C,
    MLP 8C^2 + 5C, two LayerNorms 4C), the head's LayerNorm 2C and its unbiased VC.
    Lesson 81's explorer computes the same; tests compare both with `count_parameters`."""
    V, T, L, C = config.vocab_size, config.context, config.n_layer, config.n_embd
    return V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C + V * C


def count_parameters(module: nn.Module) -> int:
    """Number of trainable parameters (elements) in `module`."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def build_model(kind: str, seed: int, config: GPTConfig | None = None,
                device: torch.device | str = "cpu") -> nn.Module:
    """A freshly initialised "mlp" or "gpt" from `seed`, the same on every rank that asks.

    Initialised on the CPU (the same numbers on every machine), then moved to `device`. The
    caller's random state is left as it was: the seed applies to this model only.
    """
    if kind not in ("mlp", "gpt"):
        raise ValueError(f"unknown model kind {kind!r}: use 'mlp' or 'gpt'")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MLP() if kind == "mlp" else MiniGPT(config or GPTConfig())
    return model.to(device)
