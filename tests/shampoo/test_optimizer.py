"""Shampoo's contract details: bad input, exponents, decomposition failure, state round-trip, groups."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch

from icml26.shampoo import Shampoo, resolve_exponents


def tiny():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))


def train(model, opt, steps=4, x=None):
    x = torch.randn(16, 6, generator=torch.Generator().manual_seed(9)) if x is None else x
    for _ in range(steps):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"lr": -1.0}, "lr must be"),
        ({"lr": float("nan")}, "lr must be"),
        ({"lr": float("inf")}, "lr must be"),
        ({"betas": (1.0, 0.9)}, "betas"),
        ({"betas": (0.9, -0.1)}, "betas"),
        ({"betas": (0.9,)}, "betas"),
        ({"eps": 0.0}, "eps must be"),
        ({"eps": -1e-6}, "eps must be"),
        ({"graft_eps": 0}, "graft_eps"),
        ({"weight_decay": -0.1}, "weight_decay"),
        ({"grafting": "rmsprop"}, "grafting must be"),
        ({"precondition_frequency": 0}, "precondition_frequency"),
        ({"start_preconditioning_step": 0}, "start_"),
        ({"max_preconditioner_dim": 0}, "max_preconditioner_dim"),
        ({"factor_dtype": torch.float16}, "factor_dtype"),
        ({"exponents": "both"}, "exponents must be one of"),
        ({"exponents": (-0.1, 0.6)}, "exponents must be"),
        ({"exponents": (0.0, 0.0)}, "exponents must be"),
    ],
)
def test_bad_hyperparameters_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Shampoo(tiny().parameters(), **kwargs)


def test_bad_group_override_raises():
    m = tiny()
    with pytest.raises(ValueError, match="lr must be"):
        Shampoo([{"params": m[0].parameters()}, {"params": m[2].parameters(), "lr": -1}])
    with pytest.raises(TypeError, match="exponents must be"):
        Shampoo(m.parameters(), exponents=("a", 1))


def test_exponent_presets_and_warning():
    assert resolve_exponents("two_sided") == (0.25, 0.25)
    assert resolve_exponents("left") == (0.5, 0.0)
    assert resolve_exponents("right") == (0.0, 0.5)
    with pytest.warns(UserWarning, match="sum to 0.6"):
        Shampoo(tiny().parameters(), exponents=(0.3, 0.3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Shampoo(tiny().parameters(), exponents=(0.125, 0.375))


@pytest.mark.parametrize(
    "dtype, value", [(torch.float16, 1000.0), (torch.float32, 1e30), (torch.bfloat16, 1e30)]
)
def test_large_finite_gradients_are_not_mistaken_for_overflow(dtype, value):
    # the 2-norm of these gradients overflows in their own dtype; the gradients themselves are finite
    w = torch.nn.Parameter(torch.zeros(100, 100, dtype=dtype))
    opt = Shampoo([w], lr=1e-3)
    w.grad = torch.full_like(w, value)
    opt.step()
    assert torch.isfinite(w).all()
    w.grad = torch.full_like(w, value)
    w.grad[3, 4] = float("inf")
    with pytest.raises(ValueError, match="NaN or Inf"):
        opt.step()


def test_complex_parameters_are_refused():
    z = torch.nn.Parameter(torch.zeros(3, 3, dtype=torch.complex64))
    with pytest.raises(TypeError, match=r"params: .*complex parameters of shapes \[\(3, 3\)\]"):
        Shampoo([z])
    opt = Shampoo([torch.nn.Parameter(torch.zeros(2, 2))])
    with pytest.raises(TypeError, match="complex"):
        opt.add_param_group({"params": [z]})
    assert len(opt.param_groups) == 1


def test_nan_gradient_raises_before_touching_state():
    m = tiny()
    opt = Shampoo(m.parameters(), lr=1e-2, precondition_frequency=1)
    train(m, opt, steps=2)
    before = copy.deepcopy(opt.state_dict())
    params_before = [p.detach().clone() for p in m.parameters()]
    opt.zero_grad()
    m(torch.randn(4, 6)).square().mean().backward()
    m[0].weight.grad[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"NaN or Inf.*\(5, 6\)|\(5, 6\).*NaN or Inf"):
        opt.step()
    after = opt.state_dict()
    for pid, st in before["state"].items():
        assert after["state"][pid]["step"] == st["step"]
        torch.testing.assert_close(after["state"][pid]["exp_avg"], st["exp_avg"])
    for p, q in zip(m.parameters(), params_before, strict=True):
        assert torch.equal(p, q)


def test_sparse_gradients_are_rejected():
    emb = torch.nn.Embedding(10, 4, sparse=True)
    opt = Shampoo(emb.parameters())
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(ValueError, match="sparse"):
        opt.step()


def test_failed_decomposition_falls_back_to_the_grafted_step(monkeypatch):
    """eigh failing: warn once, take the Adam step for that block (never NaN), recover when eigh works."""
    m = tiny()
    ref = copy.deepcopy(m)
    opt = Shampoo(m.parameters(), lr=1e-2, start_preconditioning_step=1, precondition_frequency=1)
    adamw = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.0, eps=1e-8)

    def broken(*args, **kwargs):
        raise torch.linalg.LinAlgError("linalg.eigh: the algorithm failed to converge")

    monkeypatch.setattr(torch.linalg, "eigh", broken)
    with pytest.warns(RuntimeWarning, match="failed to decompose") as record:
        train(m, opt, steps=3)
        train(ref, adamw, steps=3)
    assert len([w for w in record if issubclass(w.category, RuntimeWarning)]) == 1
    for p, q in zip(m.parameters(), ref.parameters(), strict=True):
        assert torch.isfinite(p).all()
        torch.testing.assert_close(p, q, rtol=0, atol=1e-7)
    monkeypatch.undo()
    train(m, opt, steps=1)
    assert all(all(opt.state[p]["root_ready"]) for p in m.parameters() if p.ndim == 2)


def test_keeps_the_last_good_root_when_a_later_decomposition_fails(monkeypatch):
    m = tiny()
    opt = Shampoo(m.parameters(), lr=1e-2, start_preconditioning_step=1, precondition_frequency=1)
    train(m, opt, steps=2)
    roots = {id(p): opt.state[p]["left_root"][0].clone() for p in m.parameters() if p.ndim == 2}
    monkeypatch.setattr(
        torch.linalg, "eigh", lambda *a, **k: (_ for _ in ()).throw(torch.linalg.LinAlgError("x"))
    )
    with pytest.warns(RuntimeWarning):
        train(m, opt, steps=1)
    for p in m.parameters():
        if p.ndim == 2:
            assert torch.equal(opt.state[p]["left_root"][0], roots[id(p)])


def test_bfloat16_state_round_trip_keeps_float32_state():
    m = tiny().to(torch.bfloat16)
    opt = Shampoo(m.parameters(), lr=1e-2, precondition_frequency=2)
    x = torch.randn(16, 6).to(torch.bfloat16)
    train(m, opt, steps=5, x=x)
    m2 = copy.deepcopy(m)
    opt2 = Shampoo(m2.parameters(), lr=1e-2, precondition_frequency=2)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))
    for st in opt2.state.values():
        assert st["exp_avg"].dtype == torch.float32
    train(m, opt, steps=3, x=x)
    train(m2, opt2, steps=3, x=x)
    for p, q in zip(m.parameters(), m2.parameters(), strict=True):
        assert p.dtype == torch.bfloat16 and torch.equal(p, q)


def test_state_dict_survives_torch_save(tmp_path):
    m = tiny()
    opt = Shampoo(m.parameters(), lr=1e-2, precondition_frequency=2, max_preconditioner_dim=3)
    train(m, opt, steps=5)
    torch.save(opt.state_dict(), tmp_path / "opt.pt")
    loaded = torch.load(tmp_path / "opt.pt", weights_only=True)
    opt2 = Shampoo(copy.deepcopy(m).parameters(), lr=1e-2, precondition_frequency=2, max_preconditioner_dim=3)
    opt2.load_state_dict(loaded)
    assert opt2.state_dict()["state"][0]["step"] == 5


def test_group_overrides_are_used():
    m = tiny()
    opt = Shampoo(
        [
            {"params": m[0].parameters(), "exponents": "left"},
            {"params": m[2].parameters(), "grafting": "none", "lr": 0.1},
        ],
        lr=1e-2,
        start_preconditioning_step=1,
        precondition_frequency=1,
    )
    train(m, opt, steps=2)
    assert opt.param_groups[0]["exponents"] == (0.5, 0.0) and opt.state[m[0].weight]["right"] == []
    assert len(opt.state[m[2].weight]["right"]) == 1


def test_blocking_splits_large_dimensions():
    W = torch.nn.Parameter(torch.randn(10, 7))
    opt = Shampoo([W], max_preconditioner_dim=4, start_preconditioning_step=1, precondition_frequency=1)
    W.grad = torch.randn(10, 7)
    opt.step()
    st = opt.state[W]
    assert [tuple(t.shape) for t in st["left"]] == [(4, 4)] * 2 + [(4, 4)] * 2 + [(2, 2)] * 2
    assert [tuple(t.shape) for t in st["right"]] == [(4, 4), (3, 3)] * 3
    assert opt.optimizer_state_bytes() > 2 * W.numel() * 4


def test_closure_loss_and_scalar_params():
    s = torch.nn.Parameter(torch.tensor(3.0))
    opt = Shampoo([s], lr=0.1)

    def closure():
        opt.zero_grad()
        loss = (s - 1.0) ** 2
        loss.backward()
        return loss

    losses = [opt.step(closure).item() for _ in range(50)]
    assert losses[-1] < losses[0] and math.isfinite(losses[-1])
