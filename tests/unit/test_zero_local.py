"""ZeRO pieces that need no ranks: flatten/unflatten, the Adam update, argument checks."""

import pytest
import torch

from lesson_code.models import MLP, build_model
from lesson_code.zero import MasterAdam, ZeroOptimizer, adam_update, flatten_params, unflatten_into


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
