"""Both ends of every message take the same path: batched on one end means batched on the other.

Under NCCL, `Peers` posts its messages as one group (batch_isend_irecv) and PyTorch carries
batched messages on another communicator than single isend/irecv: a send posted singly never
meets a receive posted in a batch, and both ranks wait until their timeout. No GPU is needed to
check that the two ends agree: on gloo ranks, `Peers` is told it runs under NCCL (gloo carries
batches too), and every message is recorded with its path, direction and peer on both ends.
"""

import pytest
import torch

from lesson_code import launch
from lesson_code.collectives import choose, p2p


def record_every_message(rank, world_size, collective, algorithm):
    """Run one collective with batched posting on; [(path, "send" or "recv", global peer)]."""
    log = []
    real_init, real_post, real_together = p2p.Peers.__init__, p2p.Peers._post, p2p.Peers._post_together

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.batched = True  # as under NCCL

    def post(self, post, tensor, peer):
        if tensor is not None and tensor.numel():
            log.append(("single", "send" if post is p2p.dist.isend else "recv", self.global_rank(peer)))
        return real_post(self, post, tensor, peer)

    def together(self, recvs, sends):
        for direction, pairs in (("recv", recvs), ("send", sends)):
            log.extend(("batched", direction, self.global_rank(peer))
                       for tensor, peer in pairs if tensor is not None and tensor.numel())
        return real_together(self, recvs, sends)

    p2p.Peers.__init__, p2p.Peers._post, p2p.Peers._post_together = init, post, together
    tensor = torch.arange(4 * world_size + 3, dtype=torch.float32) * (rank + 1)
    if collective == "all_gather":
        choose.all_gather(tensor[: rank + 2].clone(), algorithm=algorithm, timeout_s=20)
    else:
        getattr(choose, collective)(tensor, algorithm=algorithm, timeout_s=20)
    return log


CASES = [(collective, algorithm) for collective, table in choose.ALGORITHMS.items()
         for algorithm in table if algorithm != "shared_memory"]  # shared memory sends no data


@pytest.mark.parametrize("collective,algorithm", CASES)
def test_both_ends_of_every_message_are_batched_alike(collective, algorithm):
    logs = launch.spawn(record_every_message, collective, algorithm, world_size=3, timeout_s=60)
    for rank, log in enumerate(logs):
        for path, direction, peer in log:
            opposite = "recv" if direction == "send" else "send"
            assert (path, opposite, rank) in logs[peer], (
                f"{collective} {algorithm}: rank {rank} posts a {direction} with {peer} {path}, "
                f"rank {peer} has no {path} {opposite} with {rank}: {logs[peer]}")
