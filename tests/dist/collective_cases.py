"""The inputs every all-reduce algorithm is checked on, with torch.distributed's answer."""

import torch.distributed as dist

from lesson_code import collectives_lab


def lengths_for(world_size):
    """0, 1, fewer elements than ranks, not divisible by the world size, and a larger one."""
    return sorted({0, 1, max(world_size - 1, 0), 2 * world_size + 1, 1000})


def all_reduce_cases(rank, world_size):
    """(length, dtype name, this rank's input, the built-in all-reduce of it, the float bound)."""
    for length in lengths_for(world_size):
        for dtype in collectives_lab.DTYPES:
            tensor = collectives_lab.make_input(rank, length, dtype, seed=length)
            builtin = tensor.clone()
            dist.all_reduce(builtin)
            yield length, dtype, tensor, builtin, collectives_lab.summation_bound(tensor, world_size)
