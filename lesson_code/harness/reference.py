"""References computed under the ranks' conditions (lessons 77-81).

A rank runs with one torch thread (`launch` sets it), while a notebook kernel or a test process
uses as many threads as the machine has cores. Matrix products split their sums differently with
another thread count, so a reference trained in the caller differs from the same training on a
rank in the last bits, by an amount that depends on the reader's machine. `in_one_rank` computes
a reference in a fresh one-rank process instead: one thread, the ranks' environment, and the same
device the ranks use (a GPU under NCCL), whatever the caller's thread count.

    from lesson_code import zero_lab
    from lesson_code.harness import reference
    single = reference.in_one_rank(zero_lab.train_single_process, zero_lab.ZeroRun())
"""

from __future__ import annotations

from typing import Any, Callable

from lesson_code import launch


def in_one_rank(fn: Callable[..., Any], *args: Any, like_world_size: int = 4,
                timeout_s: float = launch.DEFAULT_TIMEOUT_S) -> Any:
    """Return `fn(*args)` computed in one fresh rank process (world size 1, one torch thread).

    The process uses the backend, so the device, that `launch.spawn` would give
    `like_world_size` ranks (the lessons use 4): a machine with one GPU runs 4 ranks on the CPU,
    and so their reference too. `fn` must be importable by the rank (a module-level function,
    not a lambda or a notebook function). Raises what `launch.spawn` raises: ValueError,
    RankFailedError with the rank's traceback, RankCrashedError, RankTimeoutError.
    """
    launch.check_importable(fn)
    backend = launch.resolve_backend("auto", like_world_size)
    return launch.spawn(_call, fn, args, world_size=1, backend=backend, timeout_s=timeout_s)[0]


def _call(rank: int, world_size: int, fn: Callable[..., Any], args: tuple) -> Any:
    """Rank function of `in_one_rank`: call `fn(*args)`; rank and world size are not passed on."""
    return fn(*args)
