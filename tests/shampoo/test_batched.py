"""Shampoo on accelerators (issue #55): batched roots and products, no host reads in the step, Newton roots.

Host reads are counted two ways: ``torch.profiler`` events ``aten::item`` / ``aten::_local_scalar_dense`` (what
C++ code such as ``linalg.eigh``'s own convergence check reads back), and a ``TorchFunctionMode`` that sees every
Python-level read of a tensor (``item``, ``tolist``, ``bool``, ``float``, ...). On a CPU nothing is copied, but
each of these calls is a device synchronisation on an accelerator.
"""

from __future__ import annotations

import copy
from collections import Counter

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.profiler import ProfilerActivity, profile

from icml26.shampoo import Shampoo, matrix_inverse_root
from icml26.shampoo import optimizer as shampoo_optimizer
from icml26.shampoo.optimizer import _batched_roots, shampoo_update
from icml26.shampoo.reference import inverse_root, reference_shampoo

from .test_reference import CONFIGS, _reference, _run_shampoo, eigh_tolerance, stochastic_quadratic

READS = {"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "numpy"}
#: ops that make no kernel: views and dtype no-ops (their count grows with the number of parameters)
VIEWS = {
    "aten::reshape",
    "aten::view",
    "aten::unsqueeze",
    "aten::slice",
    "aten::select",
    "aten::to",
    "aten::mT",
}


class _HostReads(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in READS:
            self.reads.append(name)
        return func(*args, **(kwargs or {}))


def _profile(fn) -> tuple[Counter, list[str], Counter]:
    """(all op events, Python-level host reads, ops called directly by the step) of one call of ``fn``."""
    with profile(activities=[ProfilerActivity.CPU]) as prof, _HostReads() as mode:
        fn()
    events = prof.events()
    direct = Counter(e.name for e in events if e.cpu_parent is not None and e.cpu_parent.cpu_parent is None)
    return Counter(e.name for e in events), mode.reads, direct


def _params(shapes, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=g, dtype=dtype)) for s in shapes]


def _step(opt, params, g):
    for p in params:
        p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype)
    opt.step()


#: blocks of 32 give (32, 32) blocks from four parameters, and (32, 16), (16, 32), (16, 16) edge blocks
MIXED = [(64, 32), (64, 32), (32, 64), (48, 80), (7,), (3, 2, 4, 4)]


def _mixed_opt(**kw):
    params = _params(MIXED)
    kw = {
        "lr": 1e-3,
        "precondition_frequency": 5,
        "start_preconditioning_step": 1,
        "max_preconditioner_dim": 32,
        "check_finite": False,
        **kw,
    }
    return params, Shampoo(params, **kw)


def _factor_sizes(opt) -> set[int]:
    return {t.shape[0] for st in opt.state.values() for k in ("left", "right") for t in st.get(k, [])}


# ------------------------------------------------------------------------------------------- host reads
def test_non_root_steps_read_nothing_from_the_device():
    params, opt = _mixed_opt()
    g = torch.Generator().manual_seed(1)
    _step(opt, params, g)  # step 1: a root computation
    for _ in range(3):  # steps 2-4: statistics and preconditioning, no roots
        events, reads, _ = _profile(lambda: _step(opt, params, g))
        assert events["aten::item"] == events["aten::_local_scalar_dense"] == 0
        assert reads == [] and events["aten::linalg_eigh"] == 0


def test_the_finiteness_check_is_the_only_read_of_a_checked_step():
    params, opt = _mixed_opt(check_finite=True)
    g = torch.Generator().manual_seed(1)
    _step(opt, params, g)
    events, reads, _ = _profile(lambda: _step(opt, params, g))
    assert reads == ["__bool__"] and events["aten::item"] == 1


@pytest.mark.parametrize("exponents", ["two_sided", "smaller", "left"])
def test_a_root_computation_makes_one_eigh_call_per_factor_size_and_one_read(exponents):
    params, opt = _mixed_opt(exponents=exponents)
    g = torch.Generator().manual_seed(1)
    events, reads, _ = _profile(lambda: _step(opt, params, g))
    sizes = _factor_sizes(opt)
    n_factors = sum(len(st.get(k, [])) for st in opt.state.values() for k in ("left", "right"))
    assert n_factors > 2 * len(sizes)  # the model has many more factors than sizes
    assert events["aten::linalg_eigh"] == len(sizes)
    # one read of all the masks by the optimizer; the rest is each eigh call checking its own convergence
    assert reads == ["tolist"]
    assert events["aten::item"] == events["aten::_local_scalar_dense"] == len(sizes)
    assert all(all(st["root_ready"]) for st in opt.state.values() if "root_ready" in st)


def test_newton_roots_make_no_eigh_call():
    # eps 1e-3: visible beside these factors' largest eigenvalues in float32, so every Newton root converges
    params, opt = _mixed_opt(root_method="newton", eps=1e-3)
    g = torch.Generator().manual_seed(1)
    events, reads, _ = _profile(lambda: _step(opt, params, g))
    assert events["aten::linalg_eigh"] == 0 and events["aten::item"] == 0 and reads == ["tolist"]


# --------------------------------------------------------------------------------- launches per step
def _non_root_step_ops(shapes, max_dim):
    params = _params(shapes)
    opt = Shampoo(
        params,
        lr=1e-3,
        precondition_frequency=100,
        start_preconditioning_step=1,
        max_preconditioner_dim=max_dim,
        check_finite=False,
    )
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        _step(opt, params, g)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)
    return _profile(opt.step)


def test_launches_of_a_step_do_not_grow_with_the_blocks_of_a_parameter():
    four, _, direct_four = _non_root_step_ops([(64, 64)], 32)  # 2 x 2 blocks of 32 x 32
    eight, _, direct_eight = _non_root_step_ops([(64, 128)], 32)  # 2 x 4 blocks
    many, _, direct_many = _non_root_step_ops([(128, 256)], 32)  # 4 x 8 blocks
    assert direct_four == direct_eight == direct_many  # the ops the step calls
    assert four == eight == many  # and every op they call in turn
    assert eight["aten::bmm"] == 2 and eight["aten::baddbmm_"] == 2 and eight["aten::linalg_vector_norm"] == 2
    # two blocks in one column are a view of the matrix: no gather copy at all, the rest unchanged
    _, _, direct_two = _non_root_step_ops([(64, 32)], 32)
    assert {k: v for k, v in direct_two.items() if k not in VIEWS} == {
        k: v for k, v in direct_eight.items() if k not in VIEWS
    }


def test_launches_of_a_step_do_not_grow_with_the_parameters_of_a_shape():
    _, _, two = _non_root_step_ops([(32, 32)] * 2, 32)
    _, _, eight = _non_root_step_ops([(32, 32)] * 8, 32)
    assert {k: v for k, v in two.items() if k not in VIEWS} == {
        k: v for k, v in eight.items() if k not in VIEWS
    }
    assert eight["aten::bmm"] == 2 and eight["aten::baddbmm_"] == 2 and eight["aten::cat"] == 2  # G and M


# ------------------------------------------------------------------------------------ stacked = separate
def test_stacked_parameters_step_exactly_as_each_alone():
    """Blocks of several parameters stacked in one batch give each parameter's own trajectory (bit for bit):
    nothing mixes one parameter's blocks into another's, including when one misses its gradient (a subset)."""
    kw = dict(lr=1e-2, precondition_frequency=3, start_preconditioning_step=2, max_preconditioner_dim=32)
    together = _params(MIXED, seed=3)
    alone = [copy.deepcopy(p) for p in together]
    opt = Shampoo(together, **kw)
    singles = [Shampoo([p], **kw) for p in alone]
    g = torch.Generator().manual_seed(4)
    for k in range(9):
        grads = [torch.randn(p.shape, generator=g) for p in together]
        skip = 1 if k % 3 == 1 else None  # parameter 1 has no gradient on steps 2, 5, 8
        for i, (p, q, gr) in enumerate(zip(together, alone, grads, strict=True)):
            p.grad = None if i == skip else gr.clone()
            q.grad = None if i == skip else gr.clone()
        opt.step()
        for i, o in enumerate(singles):
            if i != skip:
                o.step()
    for p, q in zip(together, alone, strict=True):
        assert torch.equal(p, q)
    assert opt.state[together[1]]["step"] == 6 and opt.state[together[0]]["step"] == 9


def test_state_holds_views_of_one_stack_per_block_shape_and_round_trips():
    params, opt = _mixed_opt()
    g = torch.Generator().manual_seed(1)
    _step(opt, params, g)
    a, b = opt.state[params[0]]["left"][0], opt.state[params[1]]["left"][1]
    assert (
        a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    )  # one stack for all (32, 32) blocks
    before = opt.optimizer_state_bytes()
    clone = [copy.deepcopy(p) for p in params]
    opt2 = Shampoo(clone, **{k: v for k, v in opt.defaults.items() if k != "exponents"})
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))
    for _ in range(6):
        h = g.get_state()
        _step(opt, params, g)
        g.set_state(h)
        _step(opt2, clone, g)
    for p, q in zip(params, clone, strict=True):
        assert torch.equal(p, q)
    assert opt2.optimizer_state_bytes() == before


def test_the_pure_update_without_a_cache_matches_the_class():
    params, opt = _mixed_opt()
    clone = [copy.deepcopy(p) for p in params]
    states = [{} for _ in clone]
    hyper = {k: v for k, v in opt.param_groups[0].items() if k not in ("params", "check_finite")}
    g = torch.Generator().manual_seed(2)
    for _ in range(7):
        grads = [torch.randn(p.shape, generator=g) for p in params]
        for p, gr in zip(params, grads, strict=True):
            p.grad = gr
        opt.step()
        with torch.no_grad():
            shampoo_update(clone, grads, states, **hyper)
    for p, q in zip(params, clone, strict=True):
        assert torch.equal(p, q)


# ------------------------------------------------------------------------------ device-side fallbacks
def test_float32_retry_in_float64_only_for_the_failing_factor(monkeypatch):
    """A float32 root with NaN (as eigh can return) is retried in float64 for that factor alone, on the
    subset; the other factors of the batch keep their float32 roots."""
    W = torch.nn.Parameter(torch.randn(64, 64, generator=torch.Generator().manual_seed(0)))
    opt = Shampoo(
        [W], lr=1e-3, precondition_frequency=1, start_preconditioning_step=1, max_preconditioner_dim=32
    )
    real, seen = torch.linalg.eigh, []

    def nan_for_block_2(a, *args, **kwargs):
        seen.append((a.dtype, a.shape[0]))
        w, v = real(a, *args, **kwargs)
        if a.dtype == torch.float32 and a.shape[0] > 1:
            v = v.clone()
            v[2, 0, 0] = float("nan")
        return w, v

    W.grad = torch.randn(64, 64, generator=torch.Generator().manual_seed(1))
    monkeypatch.setattr(torch.linalg, "eigh", nan_for_block_2)
    opt.step()
    st = opt.state[W]
    # left and right factors of the 4 blocks (all 32 x 32): one float32 batch of 8, one float64 retry of 1
    assert seen == [(torch.float32, 8), (torch.float64, 1)]
    assert all(st["root_ready"]) and st["root_failures"] == 0
    bias2 = 1 - 0.999
    for b in range(4):
        for side in ("left", "right"):
            factor = st[side][b] / bias2
            expect = matrix_inverse_root(
                factor, 0.25, 1e-6, torch.float64 if (b, side) == (2, "left") else torch.float32
            )
            torch.testing.assert_close(st[f"{side}_root"][b], expect.float(), rtol=1e-5, atol=1e-6)
    assert torch.isfinite(W).all()


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_failing_block_keeps_its_roots_while_the_others_update(side, monkeypatch):
    W = torch.nn.Parameter(torch.randn(64, 64, generator=torch.Generator().manual_seed(0)))
    opt = Shampoo(
        [W], lr=1e-3, precondition_frequency=2, start_preconditioning_step=1, max_preconditioner_dim=32
    )
    g = torch.Generator().manual_seed(1)
    W.grad = torch.randn(64, 64, generator=g)
    opt.step()
    st = opt.state[W]
    roots = {k: [t.clone() for t in st[k]] for k in ("left_root", "right_root")}
    st[side][3][0, 0] = float("inf")  # one of block 3's factors: its other root must not move either
    W.grad = torch.randn(64, 64, generator=g)
    opt.step()
    W.grad = torch.randn(64, 64, generator=g)
    real, calls = torch.linalg.eigh, []
    monkeypatch.setattr(
        torch.linalg, "eigh", lambda a, *x, **k: (calls.append(a.shape[0]), real(a, *x, **k))[1]
    )
    with pytest.warns(RuntimeWarning, match="1 preconditioner block"):
        opt.step()  # step 3: a root computation
    # the non-finite factor is masked on the device: still one batched eigh for all eight 32 x 32 factors
    assert calls == [8]
    assert st["root_failures"] == 1 and all(st["root_ready"])
    for k in ("left_root", "right_root"):
        assert torch.equal(st[k][3], roots[k][3])
        assert all(not torch.equal(st[k][b], roots[k][b]) for b in range(3))
    assert torch.isfinite(W).all()


# ----------------------------------------------------------------------------------------- Newton roots
def _spd(d, rank, scale, seed):
    g = np.random.default_rng(seed)
    a = g.normal(size=(d, rank)) * scale
    return a @ a.T


@pytest.mark.parametrize("exponent", [0.25, 0.5])
@pytest.mark.parametrize("d, rank, scale", [(16, 16, 1.0), (32, 8, 0.3), (64, 64, 0.1), (10, 3, 1.0)])
def test_newton_roots_match_the_float64_reference(exponent, d, rank, scale):
    A = _spd(d, rank, scale, seed=d + rank)
    ref = inverse_root(A, exponent, 1e-6)
    errors = {}
    for method, dtype in (("newton", torch.float32), ("eigh", torch.float32), ("newton", torch.float64)):
        root, finite, ok = _batched_roots(torch.tensor(A).unsqueeze(0), exponent, 1e-6, dtype, method)
        assert bool(finite[0]) and bool(ok[0])  # converged: no fallback needed
        errors[method, dtype] = np.linalg.norm(root[0].double().numpy() - ref) / np.linalg.norm(ref)
    # float32 Newton is as accurate as a float32 eigendecomposition; float64 Newton near float64 round-off
    assert errors["newton", torch.float32] <= 3 * errors["eigh", torch.float32] + 1e-6
    kappa = np.linalg.eigvalsh(A + 1e-6 * np.eye(d)).max() / 1e-6
    assert errors["newton", torch.float64] <= 16 * np.finfo(np.float64).eps * kappa


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("shape", [(7, 5), (4, 9)])
def test_newton_optimizer_matches_the_float64_reference(cfg, shape, monkeypatch):
    """In float64 the Newton roots converge on every reference configuration (no eigh fallback) and the
    optimizer stays within the eigendecomposition's own tolerance of the literal reference."""
    expected, kappa = _reference(cfg, shape)
    real, calls = torch.linalg.eigh, []
    monkeypatch.setattr(torch.linalg, "eigh", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    got = _run_shampoo(cfg, shape, root_method="newton")
    assert calls == []
    np.testing.assert_allclose(got, expected, rtol=0, atol=eigh_tolerance(kappa, np.abs(expected).max()))


def test_newton_in_float32_is_as_close_to_the_reference_as_float32_eigh():
    cfg = dict(exponents=(0.25, 0.25), grafting="adam", start=3, freq=2)
    expected = reference_shampoo(
        np.random.default_rng(1).normal(size=(7, 5)),
        stochastic_quadratic((7, 5), 2),
        steps=12,
        lr=0.05,
        exponents=cfg["exponents"],
        grafting="adam",
        start=3,
        freq=2,
    )
    errors = {}
    for method in ("eigh", "newton"):
        X = torch.nn.Parameter(
            torch.tensor(np.random.default_rng(1).normal(size=(7, 5)), dtype=torch.float32)
        )
        opt = Shampoo(
            [X], lr=0.05, start_preconditioning_step=3, precondition_frequency=2, root_method=method
        )
        grad = stochastic_quadratic((7, 5), 2)
        for _ in range(12):
            X.grad = torch.tensor(grad(X.detach().double().numpy()), dtype=torch.float32)
            opt.step()
        errors[method] = np.abs(X.detach().double().numpy() - expected).max()
    assert errors["newton"] <= 3 * errors["eigh"] + 1e-6


def test_newton_falls_back_to_eigh_when_the_residual_is_too_large(monkeypatch):
    """One Newton iteration leaves a large residual: every block takes the eigendecomposition root instead,
    so the run equals the eigh run exactly. With the default iterations the Newton roots are used, and the
    run is as close to one with float64 roots as the float32 eigh run is."""
    runs = {}
    for name, iterations, kw in (
        ("eigh", 40, {}),
        ("cut", 1, {"root_method": "newton"}),
        ("newton", 40, {"root_method": "newton"}),
        ("float64", 40, {"root_dtype": torch.float64}),
    ):
        monkeypatch.setattr(shampoo_optimizer, "NEWTON_ITERATIONS", iterations)
        params, opt = _mixed_opt(precondition_frequency=2, **kw)
        g = torch.Generator().manual_seed(5)
        for _ in range(5):
            _step(opt, params, g)
        runs[name] = params
    for p, q, r, exact in zip(runs["eigh"], runs["cut"], runs["newton"], runs["float64"], strict=True):
        assert torch.equal(p, q)
        if p.ndim >= 2:
            assert not torch.equal(p, r)
            assert (r - exact).abs().max() <= 3 * (p - exact).abs().max() + 1e-6


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"root_method": "cholesky"}, "root_method must be one of"),
        ({"root_method": "newton", "exponents": (0.3, 0.2)}, "integer p"),
    ],
)
def test_bad_root_method_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Shampoo([torch.nn.Parameter(torch.zeros(2, 2))], **kwargs)


def test_old_state_dicts_load_with_the_eigh_default():
    params, opt = _mixed_opt()
    _step(opt, params, torch.Generator().manual_seed(1))
    sd = copy.deepcopy(opt.state_dict())
    for group in sd["param_groups"]:
        del group["root_method"]
    opt2 = Shampoo([copy.deepcopy(p) for p in params], lr=1e-3)
    opt2.load_state_dict(sd)
    assert opt2.param_groups[0]["root_method"] == "eigh"


# ---------------------------------------------------------------------------------------- accelerator
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_no_synchronisation_in_non_root_steps_on_cuda():
    g = torch.Generator().manual_seed(1)
    params = [torch.nn.Parameter(p.detach().cuda()) for p in _params(MIXED)]
    opt = Shampoo(
        params,
        lr=1e-3,
        precondition_frequency=5,
        start_preconditioning_step=1,
        max_preconditioner_dim=32,
        check_finite=False,
    )
    grads = [[torch.randn(p.shape, generator=g).cuda() for p in params] for _ in range(4)]
    for p, gr in zip(params, grads[0], strict=True):
        p.grad = gr
    opt.step()  # root computation (reads allowed)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in grads[1:]:
            for p, gr in zip(params, step, strict=True):
                p.grad = gr
            opt.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(torch.isfinite(p).all() for p in params)
