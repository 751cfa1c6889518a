"""ZeRO pieces that need no ranks: flatten/unflatten, the Adam update, argument checks, and the
allocation trace that measures ZeRO's memory."""

import pytest
import torch

from lesson_code.harness.allocations import BEFORE, AllocationTrace
from lesson_code.models import MLP, build_model
from lesson_code.zero import MasterAdam, ZeroOptimizer, adam_update, flatten_params, unflatten_into
from lesson_code.zero2 import Zero2Optimizer
from lesson_code.zero3 import Zero3Optimizer


def test_flatten_then_unflatten_is_exact():
    model = build_model("gpt", 0)
    flat = flatten_params(model)
    assert flat.dim() == 1 and flat.numel() == sum(p.numel() for p in model.parameters())
    other = build_model("gpt", 1)
    unflatten_into(other, flat)
    for a, b in zip(model.parameters(), other.parameters()):
        assert torch.equal(a, b)


def test_unflatten_rejects_a_wrong_length_and_says_how_to_fix_it():
    model = MLP()
    flat = torch.cat([flatten_params(model), torch.zeros(2)])
    with pytest.raises(ValueError, match=r"needs a 1-D tensor of 6922 elements .*flat\[:6922\]"):
        unflatten_into(model, flat)


def test_mixed_dtypes_are_refused():
    model = MLP()
    model.layers[0].to(torch.bfloat16)
    with pytest.raises(ValueError, match="mix dtypes"):
        flatten_params(model)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adam_update_agrees_with_torch_adam_to_a_few_ulps(weight_decay):
    """Our Adam and torch's, fed the same gradients, stay within a few units in the last place.

    The two write the same formulas with other operations (torch blends the moments with lerp_,
    and its vectorised kernels may fuse a multiply-add on one CPU and not on another), so equal
    bits are not promised. Each step, either side rounds the parameter (half an ulp of |p|) and
    computes the update lr * m / (sqrt(v) + eps) in about ten roundings (10 eps relative to
    its size, at most lr): after `step` steps they differ by at most
    step * (eps * |p| + 10 * eps * lr) per element, a small fraction of one update.
    """
    torch.manual_seed(0)
    lr, eps = 1e-2, torch.finfo(torch.float32).eps
    param = torch.randn(1000)
    reference = param.clone().requires_grad_(True)
    optimizer = torch.optim.Adam([reference], lr=lr, weight_decay=weight_decay)
    exp_avg, exp_avg_sq = torch.zeros(1000), torch.zeros(1000)
    for step in range(1, 6):
        grad = torch.randn(1000)
        reference.grad = grad.clone()
        optimizer.step()
        adam_update(param, grad, exp_avg, exp_avg_sq, step, lr, (0.9, 0.999), 1e-8, weight_decay)
        bound = step * (eps * param.abs() + 10 * eps * lr)
        assert ((param - reference.detach()).abs() <= bound).all()
    # The bound is far tighter than one update: a single extra step lies well outside it.
    wrong = reference.detach().clone()
    adam_update(wrong, grad, exp_avg.clone(), exp_avg_sq.clone(), 1, lr, (0.9, 0.999), 1e-8,
                weight_decay)
    assert not ((wrong - reference.detach()).abs() <= 6 * (eps * wrong.abs() + 10 * eps * lr)).all()


def test_master_adam_on_float32_agrees_with_torch_adam():
    model, reference = build_model("mlp", 0), build_model("mlp", 0)
    ours = MasterAdam(model, lr=1e-2)
    theirs = torch.optim.Adam(reference.parameters(), lr=1e-2)
    x, y = torch.randn(8, 32), torch.randint(0, 10, (8,))
    for _ in range(3):
        for m in (model, reference):
            m.zero_grad()
            m(x, y)[1].backward()
        ours.step()
        theirs.step()
    # Two implementations of Adam: within the 1e-5 that tests/dist/test_zero.py derives.
    assert (flatten_params(model) - flatten_params(reference)).abs().max() < 1e-5
    assert ours.optimizer_state_bytes() == 12 * 6922


@pytest.mark.parametrize("kwargs, message", [
    ({"world_size": 0, "rank": 0, "lr": 1e-3}, "world_size must be a positive int"),
    ({"world_size": 4, "rank": 4, "lr": 1e-3}, "rank=4 is not in 0..3"),
    ({"world_size": 4, "rank": 0, "lr": 0.0}, "lr must be positive"),
    ({"world_size": 4, "rank": 0, "lr": 1e-3, "stage": 3}, "stage=3 is not supported"),
])
def test_bad_optimizer_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ZeroOptimizer(MLP(), **kwargs)


@pytest.mark.parametrize("units, message", [
    (lambda m: [m.layers[0], m.layers[2]], r"parameters \['layers.4.weight', 'layers.4.bias'\] "
                                           "belong to no unit"),
    (lambda m: [m.layers, m.layers[4]], "also belongs to unit layers: units must not nest"),
    (lambda m: [MLP().layers[0]], r"units \['Linear'\] are not submodules of MLP"),
])
def test_zero3_units_must_hold_every_parameter_once(units, message):
    model = MLP()
    with pytest.raises(ValueError, match=message):
        Zero3Optimizer(model, 4, 0, lr=1e-3, units=units(model))


def test_zero3_needs_units_for_a_model_it_does_not_know():
    with pytest.raises(ValueError, match=r"no default units for Sequential: pass units=\[\.\.\.\]"):
        Zero3Optimizer(torch.nn.Sequential(torch.nn.Linear(2, 2)), 4, 0, lr=1e-3)


def test_zero2_refuses_an_empty_bucket():
    with pytest.raises(ValueError, match="bucket_cap_mb must be positive, got 0"):
        Zero2Optimizer(MLP(), 4, 0, lr=1e-3, bucket_cap_mb=0)


def test_an_allocation_trace_counts_what_is_allocated_and_freed_and_where():
    with AllocationTrace() as trace:
        kept = torch.empty(1000)                               # 4000 bytes, outside any range
        with torch.profiler.record_function("outer"):
            brief = torch.empty(500)                           # 2000 bytes, freed below
            with torch.profiler.record_function("inner"):
                inner = torch.empty(250)                       # 1000 bytes
            del brief
        kept.untyped_storage().resize_(0)                      # a resize frees the storage
    outer, inner_range = trace.ranges_named("outer")[0], trace.ranges_named("inner")[0]
    assert [block.nbytes for block in trace.allocations] == [4000, 2000, 1000]
    assert trace.peak() == (7000, trace.allocations[2].allocated_ns)
    assert trace.live_by_range(inner_range.end_ns) == {BEFORE: 4000, "outer": 2000, "inner": 1000}
    assert trace.live_by_range(inner_range.end_ns, since_ns=inner_range.start_ns) == {
        BEFORE: 6000, "inner": 1000}
    assert trace.live_at(outer.end_ns) == 5000
    assert trace.series(outer.end_ns, 2 ** 62) == [(outer.end_ns, 5000),
                                                   (trace.allocations[0].freed_ns, 1000)]
    assert trace.live_at(2 ** 62) == 4 * inner.numel()  # only `inner` is left
    assert not any(block.scratch for block in trace.allocations)  # each returned by an op


def test_an_allocation_trace_can_leave_out_the_scratch_a_kernel_frees_before_it_returns():
    """A kernel may take scratch from torch's allocator and free it before it returns (oneDNN's
    bf16 matrix product does on a CPU with AVX-512, 99,968 bytes here; other CPUs' kernels may
    take none): without scratch, the peak is the product's bytes on every CPU; a tensor an
    operation returns is never scratch, even when freed inside a marked range."""
    a = torch.randn(64, 256, dtype=torch.bfloat16)
    b = torch.randn(256, 512, dtype=torch.bfloat16)
    with AllocationTrace() as trace:
        with torch.profiler.record_function("step"):
            product = a @ b
            del product
    returned = [block.nbytes for block in trace.allocations if not block.scratch]
    assert returned == [64 * 512 * 2]
    assert trace.peak(scratch=False)[0] == 64 * 512 * 2
    scratch = sum(block.nbytes for block in trace.allocations if block.scratch)
    assert trace.peak()[0] <= 64 * 512 * 2 + scratch
