"""FSDP2's collectives under a mixed-precision policy, counted from the dispatcher on real ranks.

MiniGPT-S (30,080 parameters, every dimension even) on 2 ranks: no parameter is padded, so the
counts are exact. With `param_dtype=bfloat16, reduce_dtype=float32` FSDP2 all-gathers each of
its 4 units twice in bf16 (2 x 2 bytes per element) and reduce-scatters each once in fp32
(4 bytes), while the shards Adam steps and their gradients stay float32; with no policy every
collective is float32.
"""

import torch

from lesson_code import launch
from lesson_code.ddp_lab import each_run
from lesson_code.fsdp2_traffic import mixed_precision_traffic
from lesson_code.zero_lab import ZeroRun

PARAMETERS = 30_080  # MiniGPT-S


def test_fsdp2_gathers_in_the_param_dtype_and_reduces_in_the_reduce_dtype():
    run = ZeroRun(model="gpt", steps=1)
    both = launch.spawn(each_run, mixed_precision_traffic, [run], world_size=2)
    plain = launch.spawn(each_run, mixed_precision_traffic, [run], torch.float32, torch.float32,
                         world_size=2)
    for rank in range(2):
        mixed = both[rank][0]
        assert mixed["parameters"] == PARAMETERS
        assert mixed["collectives"] == {
            ("all_gather", "bfloat16"): {"calls": 8, "bytes": 2 * 2 * PARAMETERS},
            ("reduce_scatter", "float32"): {"calls": 4, "bytes": 4 * PARAMETERS}}
        assert mixed["shard_dtype"] == mixed["grad_dtype"] == "float32"
        assert plain[rank][0]["collectives"] == {
            ("all_gather", "float32"): {"calls": 8, "bytes": 2 * 4 * PARAMETERS},
            ("reduce_scatter", "float32"): {"calls": 4, "bytes": 4 * PARAMETERS}}
