"""A torchrun worker whose asynchronous ring all-reduce times out, for tests/dist/test_ddp_faults.py.

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=... python ring_timeout_exit.py

Rank 1 joins the group but never the reduction (it sleeps until it is killed), so rank 0's
wait times out after 1 s while the ring itself would wait 120 s for its message. Rank 0 then
ends on the TimeoutError, as a training script would, and must exit at once.
"""

import time

import torch

from lesson_code import launch
from lesson_code.collectives.comm import Communicator


def wait_too_short(rank: int, world_size: int) -> None:
    if rank == 1:
        time.sleep(600)
    pending = Communicator("ring", timeout_s=120, algorithm="ring").all_reduce_async(torch.ones(8))
    print("waiting", flush=True)
    pending.wait(timeout_s=1)


if __name__ == "__main__":
    launch.run(wait_too_short, world_size=2, timeout_s=60)
