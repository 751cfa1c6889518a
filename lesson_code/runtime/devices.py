"""Which backend and device each rank uses: gloo on CPUs, NCCL with one GPU per rank (lessons 76-81).

Every rank function builds its model, data and buffers on `current_device()`, so the same code
runs on a laptop (gloo, CPU) and on a GPU machine (NCCL), where a CPU tensor in a collective
fails. Results travel back to the caller on the CPU (`to_cpu`). Imported by `lesson_code.launch`,
which re-exports these names; it imports only the standard library, torch and
`lesson_code.runtime.validate`.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist

from lesson_code.runtime.validate import require_choice, require_positive_int

BACKENDS = ("auto", "gloo", "nccl")
# What "auto" means can be fixed from outside: LESSON_CODE_BACKEND=gloo keeps a GPU machine on
# the CPU (the test suite does this, so that its figures are the book's CPU figures everywhere).
BACKEND_VARIABLE = "LESSON_CODE_BACKEND"


def resolve_backend(backend: str, world_size: int) -> str:
    """Return "gloo" or "nccl" for `backend` ("auto", "gloo" or "nccl") and `world_size` ranks.

    "auto" is the environment's LESSON_CODE_BACKEND when set, else NCCL when CUDA has at least
    one device per rank, else gloo (CPU). Raises ValueError for a world size that is not a
    positive int, an unknown backend, or NCCL without one GPU per rank.
    """
    require_positive_int("world_size", world_size, "the number of ranks, for example world_size=4")
    require_choice("backend", backend, BACKENDS)
    if backend == "auto" and os.environ.get(BACKEND_VARIABLE, "auto") != "auto":
        backend = os.environ[BACKEND_VARIABLE]
        if backend not in BACKENDS:
            raise ValueError(f"{BACKEND_VARIABLE}={backend!r} is not a backend: set it to one of "
                             f"{', '.join(BACKENDS)}, or unset it")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "auto":
        return "nccl" if gpus >= world_size else "gloo"
    if backend == "nccl" and gpus < world_size:
        raise ValueError(
            f"backend 'nccl' needs one CUDA device per rank: world_size={world_size} but this "
            f"machine has {gpus}; use backend='gloo' (CPU) or backend='auto'"
        )
    return backend


def rank_device(backend: str, local_rank: int) -> torch.device:
    """The device a rank's tensors live on: its own GPU under NCCL, the CPU under gloo.

    `local_rank` is the rank's index on its own node (torchrun's LOCAL_RANK; the rank itself
    under `launch.spawn`, which runs on one machine), because GPUs are numbered per node.
    """
    return torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")


def current_device() -> torch.device:
    """The device this process's tensors must live on: its GPU in an NCCL group, else the CPU.

    Rank functions build their models, data and buffers here, so the same function runs on a
    laptop (gloo, CPU) and on a GPU cluster (NCCL), where a CPU tensor in a collective fails.
    Outside any process group (a single-process reference) this is the CPU. The GPU is the one
    `spawn` or `init_from_env` selected (LOCAL_RANK under torchrun, the rank under spawn).
    """
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def to_cpu(result: Any) -> Any:
    """`result` with every tensor inside dicts, lists and tuples copied to the CPU.

    A rank's result travels to the caller by value; a CUDA tensor in it would make the caller (a
    notebook kernel, perhaps without a GPU) initialise CUDA to unpickle it.
    """
    if isinstance(result, torch.Tensor):
        return result.detach().cpu()
    if isinstance(result, dict):
        return {key: to_cpu(value) for key, value in result.items()}
    if isinstance(result, tuple) and hasattr(result, "_fields"):  # a named tuple
        return type(result)(*(to_cpu(value) for value in result))
    if isinstance(result, (list, tuple)):
        return type(result)(to_cpu(value) for value in result)
    return result


def clock() -> float:
    """Seconds (time.perf_counter), read after this process's queued GPU work has finished.

    GPU kernels run asynchronously: a timer read without waiting measures only their launch. Only
    the current stream is waited for, not NCCL's own streams, so a timed computation does not
    absorb messages still in flight. On the CPU this is time.perf_counter() itself.
    """
    if current_device().type == "cuda":
        torch.cuda.current_stream().synchronize()
    return time.perf_counter()
