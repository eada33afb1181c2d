"""The optimizer contract: every recipe in ``recipes.OPTIMIZERS`` passes the same tests.

step / closure / param groups / state_dict round-trip / dtypes / None grads / bad hyper-parameters /
converges on a quadratic (pytorch_optimizer and optax ``contrib`` style).
"""

from __future__ import annotations

import copy

import pytest
import torch

from .recipes import OPTIMIZERS, OptimizerRecipe

ids = [r.name for r in OPTIMIZERS]


def quadratic(dtype=torch.float32, seed=0):
    """A well-conditioned least-squares problem with a matrix and a vector parameter."""
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(16, 8, generator=g) / 4
    target_W = torch.randn(8, 6, generator=g)
    target_b = torch.randn(6, generator=g)
    Y = A @ target_W + target_b
    W = torch.nn.Parameter(torch.zeros(8, 6, dtype=dtype))
    b = torch.nn.Parameter(torch.zeros(6, dtype=dtype))

    def loss_fn():
        return ((A.to(dtype) @ W + b - Y.to(dtype)) ** 2).mean()

    return [W, b], loss_fn


def make(recipe: OptimizerRecipe, params, **kw):
    return recipe.factory(params, **{"lr": recipe.lr, **recipe.extra, **kw})


@pytest.mark.parametrize("recipe", OPTIMIZERS, ids=ids)
def test_is_a_torch_optimizer(recipe):
    params, _ = quadratic()
    assert isinstance(make(recipe, params), torch.optim.Optimizer)


@pytest.mark.parametrize("recipe", OPTIMIZERS, ids=ids)
def test_converges_on_a_quadratic(recipe):
    params, loss_fn = quadratic()
    opt = make(recipe, params)
    start = float(loss_fn().detach())
    for _ in range(recipe.steps):
        opt.zero_grad()
        loss_fn().backward()
        opt.step()
    end = float(loss_fn().detach())
    assert end < 0.05 * start, f"loss {start:.4g} -> {end:.4g}"


@pytest.mark.parametrize("recipe", OPTIMIZERS, ids=ids)
def test_closure_is_called_and_its_loss_returned(recipe):
    params, loss_fn = quadratic()
    opt = make(recipe, params)
    calls = []

    def closure():
        calls.append(1)
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        return loss

    out = opt.step(closure)
    assert calls and out is not None and torch.isfinite(out)


@pytest.mark.parametrize("recipe", OPTIMIZERS, ids=ids)
def test_param_groups_keep_their_settings(recipe):
    params, loss_fn = quadratic()
    frozen_before = params[1].detach().clone()
    opt = recipe.factory([{"params": [params[0]]}, {"params": [params[1]], "lr": 0.0}],
                         **{"lr": recipe.lr, **recipe.extra})
    for _ in range(3):
        opt.zero_grad()
        loss_fn().backward()
        opt.step()
    assert torch.equal(params[1].detach(), frozen_before), "a group with lr = 0 moved"
    assert not torch.equal(params[0].detach(), torch.zeros_like(params[0])), "the lr > 0 group did not move"


@pytest.mark.parametrize("recipe", OPTIMIZERS, ids=ids)
def test_state_dict_round_trip_continues_identically(recipe):
    params, loss_fn = quadratic()
    opt = make(recipe, params)
    for _ in range(7):
        opt.zero_grad()
        loss_fn().backward()
        opt.step()
    params2 = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt2 = make(recipe, params2)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))

    def loss2():
        g = torch.Generator().manual_seed(0)
        A = torch.randn(16, 8, generator=g) / 4
        W_t, b_t = torch.randn(8, 6, generator=g), torch.randn(6, generator=g)
        return ((A @ params2[0] + params2[1] - (A @ W_t + b_t)) ** 2).mean()

    for _ in range(5):
        for o, fn in ((opt, loss_fn), (opt2, loss2)):
            o.zero_grad()
            fn().backward()
            o.step()
    for p, q in zip(params, params2, strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize("recipe", OPTIMIZERS, ids=ids)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dtypes(recipe, dtype):
    if dtype not in recipe.dtypes:
        pytest.skip(f"{recipe.name} does not support {dtype}")
    params, loss_fn = quadratic(getattr(torch, dtype))
    opt = make(recipe, params)
    for _ in range(3):
        opt.zero_grad()
        loss_fn().backward()
        opt.step()
    for p in params:
        assert p.dtype == getattr(torch, dtype) and torch.isfinite(p).all()


@pytest.mark.parametrize("recipe", OPTIMIZERS, ids=ids)
def test_params_without_grad_are_skipped(recipe):
    params, loss_fn = quadratic()
    unused = torch.nn.Parameter(torch.ones(3, 3))
    opt = make(recipe, [*params, unused])
    opt.zero_grad()
    loss_fn().backward()
    opt.step()
    assert unused.grad is None and torch.equal(unused.detach(), torch.ones(3, 3))


@pytest.mark.parametrize("recipe", OPTIMIZERS, ids=ids)
def test_negative_lr_is_rejected(recipe):
    params, _ = quadratic()
    with pytest.raises(ValueError):
        recipe.factory(params, **{**recipe.extra, "lr": -1.0})
