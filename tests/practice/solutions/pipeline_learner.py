"""A learner's lesson 79 file, written as a learner would: the schedules and one pipelined step.

The practice tests grade it as it is (every check passes) and with one mistake each (the
variants of tests/practice/test_pipeline.py), to show that each check catches its mistake.
"""

from datetime import timedelta

import torch
import torch.distributed as dist

DEFAULT_WAIT_S = 30.0


def schedule_order(schedule, stage, num_stages, micro_batches):
    if schedule not in ("gpipe", "1f1b"):
        raise ValueError(f"unknown schedule {schedule!r}: use 'gpipe' or '1f1b'")
    for name, value in (("num_stages", num_stages), ("micro_batches", micro_batches)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if not 0 <= stage < num_stages:
        raise ValueError(f"stage {stage!r} is not in 0..{num_stages - 1}")
    m = micro_batches
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warmup = min(num_stages - stage - 1, m)
    order = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", i) for i in range(m - warmup, m)]


def pipelined_step(layers, loss_fn, inputs, targets, micro_batches, schedule, activation_shape,
                   *, group=None, timeout_s=DEFAULT_WAIT_S):
    stage, num_stages = dist.get_rank(group), dist.get_world_size(group)
    first, last = stage == 0, stage == num_stages - 1
    wait = timedelta(seconds=timeout_s)
    xs = torch.tensor_split(inputs, micro_batches)
    ys = torch.tensor_split(targets, micro_batches)
    order = schedule_order(schedule, stage, num_stages, micro_batches)
    stored, sends, total = {}, [], 0.0

    def receive(dtype, peer):
        buffer = torch.empty(activation_shape, dtype=dtype)
        dist.irecv(buffer, group=group, group_src=peer).wait(wait)
        return buffer

    def send(tensor, peer):
        tensor = tensor.contiguous()
        sends.append((dist.isend(tensor, group=group, group_dst=peer), tensor))

    for kind, i in order:
        if kind == "F":
            x = xs[i] if first else receive(torch.float32, stage - 1).requires_grad_()
            out = layers(x)
            if last:
                out = loss_fn(out, ys[i]) / micro_batches
                total += out.item()
            else:
                send(out.detach(), stage + 1)
            stored[i] = (x, out)
        else:
            x, out = stored.pop(i)
            if last:
                out.backward()
            else:
                out.backward(receive(out.dtype, stage + 1))
            if not first:
                send(x.grad, stage - 1)
    for work, _ in sends:
        work.wait(wait)
    return total if last else None
