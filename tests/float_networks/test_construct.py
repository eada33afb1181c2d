"""The construction: bit-exact values and autodiff gradients for nine activations and three formats, hard targets."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from icml26.float_networks import ACTIVATIONS, construct, saturation_thresholds, ulp_distance, verify
from icml26.float_networks.reference import same_bits, zero_sign_mismatch

FORMATS = (torch.float32, torch.float16, torch.bfloat16)


def _grid():
    return torch.arange(-64, 64, dtype=torch.float64) / 64


def _targets(n, dtype, seed, dim=1):
    g = torch.Generator().manual_seed(seed)
    vals = (torch.randn(n, generator=g, dtype=torch.float64) * 10).to(dtype).double()
    grads = (torch.randn(n, dim, generator=g, dtype=torch.float64) * 10).to(dtype).double()
    return vals, grads


@pytest.mark.parametrize("dtype", FORMATS, ids=str)
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_values_and_gradients_are_bit_exact(activation, dtype):
    pts = _grid()
    vals, grads = _targets(len(pts), dtype, seed=len(activation))
    net = construct(pts, vals, grads, activation=activation, dtype=dtype)   # audits itself
    x = pts.to(dtype).requires_grad_(True)
    out = net(x)
    # an autograd path independent of verify(): torch.func on single points
    jac = torch.func.vmap(torch.func.grad(lambda xi: net(xi[None])[0]))(pts.to(dtype))
    out.sum().backward()
    assert same_bits(out.detach(), vals.to(dtype))
    assert same_bits(x.grad, grads[:, 0].to(dtype))
    assert same_bits(jac, grads[:, 0].to(dtype))
    assert net.unreachable == []


def test_hand_computed_three_points():
    net = construct(torch.tensor([-1.0, 0.0, 0.5]), torch.tensor([2.0, -3.0, 0.0]), torch.tensor([0.25, 5.0, -1.0]),
                    activation="relu", dtype=torch.float32)
    x = torch.tensor([-1.0, 0.0, 0.5], requires_grad=True)
    y = net(x)
    y.sum().backward()
    assert y.tolist() == [2.0, -3.0, 0.0] and x.grad.tolist() == [0.25, 5.0, -1.0]


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(sorted(ACTIVATIONS)), st.sampled_from(FORMATS),
       st.lists(st.integers(-120, 120), min_size=2, max_size=12, unique=True), st.integers(0, 10_000))
def test_property_random_domains(activation, dtype, ticks, seed):
    pts = torch.tensor(sorted(ticks), dtype=torch.float64) / 128
    vals, grads = _targets(len(pts), dtype, seed)
    net = construct(pts, vals, grads, activation=activation, dtype=dtype)
    r = verify(net, pts, vals, grads)
    assert r.exact_value_frac == 1.0 and r.exact_grad_frac == 1.0 and r.nonfinite == 0


def test_two_dimensional_grid():
    side = torch.arange(8, dtype=torch.float64) / 8
    pts = torch.stack(torch.meshgrid(side, side, indexing="ij"), -1).reshape(-1, 2)
    vals, grads = _targets(64, torch.float32, seed=1, dim=2)
    for activation in ("relu", "tanh", "gelu"):
        r = verify(construct(pts, vals, grads, activation=activation), pts, vals, grads)
        assert r.exact_value_frac == 1.0 and r.exact_grad_frac == 1.0


def test_batched_equals_one_point_at_a_time():
    pts = _grid()[::4]
    vals, grads = _targets(len(pts), torch.bfloat16, seed=3)
    net = construct(pts, vals, grads, activation="silu", dtype=torch.bfloat16)
    x = pts.to(torch.bfloat16)
    one_by_one = torch.cat([net(x[i:i + 1]) for i in range(len(x))])
    assert same_bits(net(x), one_by_one)


def test_phi_composition_and_unreachable_targets():
    pts = _grid()[::8]
    n = len(pts)
    vals = torch.full((n,), 0.5, dtype=torch.float64)
    vals[::2] = 3.0
    grads = torch.full((n, 1), 1.5, dtype=torch.float64)
    grads[1::4] = 0.0

    def mse(y):
        return (y - 0.5) ** 2

    net = construct(pts, vals, grads, activation="tanh", phi=mse, audit=True)
    r = verify(net, pts, vals, grads, phi=mse)
    # phi'(0.5) = 0: a non-zero gradient target is unreachable there, a zero one is hit
    flat = {u.point for u in net.unreachable}
    assert flat == {p for p in range(n) if p % 2 == 1 and p % 4 != 1}
    assert all("phi'(g) = 0.0" in u.reason for u in net.unreachable)
    assert r.exact_value_frac == 1.0 and r.exact_reachable_grad_frac == 1.0
    assert r.exact_grad[1::4].all()


def test_rounding_can_skip_a_target():
    # phi(y) = 3 y in float16: fl(3 s) never equals some floats v; find one and check it is reported
    def triple(y):
        return 3 * y

    s = torch.arange(1024, 2048, dtype=torch.float64).to(torch.float16)     # every float16 in [1024, 2048)
    hit = set((3 * s).tolist())
    v = next(float(c) for c in torch.arange(3072, 6144, 2, dtype=torch.float64).to(torch.float16).tolist()
             if c not in hit)
    net = construct(torch.tensor([0.0, 0.5]), torch.tensor([1.0, 1.0]), torch.tensor([v, 3.0]), activation="relu",
                    dtype=torch.float16, phi=triple)
    assert [(u.point, "rounding skips" in u.reason) for u in net.unreachable] == [(0, True)]


def test_saturation_thresholds_by_hand():
    t = saturation_thresholds("tanh", torch.float32)
    assert t["hi"] == 16.0 and t["hi_value"] == 1.0 and t["d0"] == 1.0
    z = torch.tensor(8.0, requires_grad=True)
    torch.tanh(z).backward()
    assert z.grad.item() != 0.0                         # 8 is not yet saturated in float32, so 16 is the first
    s = saturation_thresholds("sigmoid", torch.float16)
    assert (s["a0"], s["d0"], s["lo_value"]) == (0.5, 0.25, 0.0)
    assert saturation_thresholds("elu", torch.float32)["flat_value"] == -1.0


def test_ulp_distance_counts_floats():
    a = torch.tensor(1.0, dtype=torch.float16)
    b = a
    for _ in range(5):
        b = torch.nextafter(b, torch.tensor(2.0, dtype=torch.float16))
    assert ulp_distance(a[None], b[None]).item() == 5
    neg = torch.tensor([-0.0, 0.0, float(np.nextafter(np.float32(0), np.float32(1)))], dtype=torch.float32)
    assert ulp_distance(neg, torch.zeros(3)).tolist() == [0.0, 0.0, 1.0]
    assert ulp_distance(torch.tensor([float("nan")]), torch.tensor([1.0])).item() == float("inf")


def test_bad_input():
    pts = torch.tensor([0.0, 0.5])
    with pytest.raises(ValueError, match="duplicate"):
        construct(torch.tensor([0.5, 0.5]), torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"outside the range of torch\.float16"):
        construct(pts, torch.tensor([1e6, 0.0]), dtype=torch.float16)
    with pytest.raises(ValueError, match=r"not representable in torch\.float16"):
        construct(pts, torch.tensor([0.1, 0.0], dtype=torch.float64), dtype=torch.float16)
    with pytest.raises(ValueError, match="activation must be one of"):
        construct(pts, torch.zeros(2), activation="softsign")
    with pytest.raises(ValueError, match="dtype must be"):
        construct(pts, torch.zeros(2), dtype=torch.float64)
    with pytest.raises(ValueError, match="values must have 2 entries"):
        construct(pts, torch.zeros(3))
    with pytest.raises(ValueError, match="NaN or infinity"):
        construct(pts, torch.tensor([float("nan"), 0.0]))
    with pytest.raises(TypeError, match="float tensor"):
        construct(pts, torch.tensor([True, False]))
    with pytest.raises(TypeError, match=r"values must be a float tensor, got dtype torch\.int64"):
        construct(pts, torch.tensor([1, 2]))
    with pytest.raises(TypeError, match=r"points must be a float tensor, got dtype torch\.int32"):
        construct(torch.tensor([0, 1], dtype=torch.int32), torch.zeros(2))
    dense = torch.arange(0, 1, 2.0 ** -11, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"too dense for torch\.float16"):
        construct(dense, torch.zeros(len(dense)), activation="gelu", dtype=torch.float16)
    net = construct(pts, torch.zeros(2))
    with pytest.raises(TypeError, match=r"must be torch\.float32"):
        net(torch.zeros(2, dtype=torch.float16))


def _hard_targets(dtype, n, seed):
    """Values and gradients from the hardest cases: +-Omega/8 and a non-power-of-two multiple near it, power-of-two
    and non-power-of-two subnormals, +0 and -0, mixed with ordinary values."""
    fi = torch.finfo(dtype)
    pool = torch.tensor([fi.max / 8, -fi.max / 8, fi.max / 8 * 1.37, fi.tiny / 8, fi.tiny * 0.3, -fi.tiny * 0.77,
                         0.0, -0.0, 3.5, -0.375], dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    vals = pool[torch.randint(len(pool), (n,), generator=g)].to(dtype).double()
    grads = pool[torch.randint(len(pool), (n, 1), generator=g)].to(dtype).double()
    return vals, grads


@pytest.mark.parametrize("dtype", FORMATS, ids=str)
@pytest.mark.parametrize("activation", ["tanh", "sigmoid", "gelu", "silu", "softplus"])
def test_hard_targets_are_hit_bit_for_bit(activation, dtype):
    """Targets near Omega/8 (v1 overflowed the gate weight: NaN) and non-power-of-two subnormals (flushed or rounded
    by kernels) are hit once each slope is scaled by its own power of two."""
    pts = _grid()[::2]
    vals, grads = _hard_targets(dtype, len(pts), seed=7)
    net = construct(pts, vals, grads, activation=activation, dtype=dtype)       # audit on: replays itself
    assert net.unreachable == []
    assert (net.scale != 1).any()                                              # the scaling was needed
    jac = torch.func.vmap(torch.func.grad(lambda xi: net(xi[None])[0]))(pts.to(dtype))
    assert same_bits(net(pts.to(dtype)).detach(), vals.to(dtype))
    assert same_bits(jac, grads[:, 0].to(dtype))
    r = verify(net, pts, vals, grads)
    assert r.exact_grad_frac == 1.0 and r.nonfinite == 0


def test_signed_zeros_are_reported():
    pts = _grid()[::8]
    n = len(pts)
    grads = torch.full((n, 1), -0.0, dtype=torch.float64)
    grads[::2] = 1.0
    net = construct(pts, torch.ones(n, dtype=torch.float64), grads, activation="tanh")
    r = verify(net, pts, torch.ones(n, dtype=torch.float64), grads)
    assert r.exact_grad_frac == 1.0                                  # IEEE equality: -0 == +0
    x = pts.float().requires_grad_(True)
    net(x).sum().backward()
    # an independent bit check: which -0 targets came back with the other sign
    other = zero_sign_mismatch(x.grad, grads[:, 0])
    assert torch.equal(r.zero_sign_mismatch[:, 0], other)
    assert r.zero_sign_mismatch_frac == float(other.double().mean()) > 0


def test_register_activation_with_the_same_guarantees(monkeypatch):
    construct_module = importlib.import_module("icml26.float_networks.construct")
    from icml26.float_networks import register_activation

    monkeypatch.setattr(construct_module, "ACTIVATIONS", dict(construct_module.ACTIVATIONS))
    monkeypatch.setattr(construct_module, "FAMILIES", dict(construct_module.FAMILIES))
    register_activation("relu6ish", lambda z: torch.clamp(z, min=0.0), "ramp")
    pts = _grid()[::4]
    for dtype in FORMATS:
        vals, grads = _hard_targets(dtype, len(pts), seed=3)
        net = construct(pts, vals, grads, activation="relu6ish", dtype=dtype)
        assert net.unreachable == [] and verify(net, pts, vals, grads).exact_grad_frac == 1.0
    with pytest.raises(ValueError, match="family must be"):
        register_activation("x", torch.relu, "odd")
    with pytest.raises(TypeError, match="callable"):
        register_activation("x", 3, "ramp")


class _SlopeDependsOnUpstream(torch.autograd.Function):
    """relu forward; backward exact for small upstream gradients, halved for large ones (a kernel a unit-gradient
    scan would accept)."""

    @staticmethod
    def forward(ctx, z):
        ctx.save_for_backward(z)
        return torch.relu(z)

    @staticmethod
    def backward(ctx, grad):
        (z,) = ctx.saved_tensors
        return torch.where(z > 0, torch.where(grad.abs() > 1e3, grad * 0.5, grad), torch.zeros_like(grad))


def test_saturation_scan_probes_large_upstream_gradients(monkeypatch):
    construct_module = importlib.import_module("icml26.float_networks.construct")
    from icml26.float_networks import register_activation, upstream_probes

    monkeypatch.setattr(construct_module, "ACTIVATIONS", dict(construct_module.ACTIVATIONS))
    monkeypatch.setattr(construct_module, "FAMILIES", dict(construct_module.FAMILIES))
    register_activation("fragile", _SlopeDependsOnUpstream.apply, "ramp")
    z = torch.tensor([64.0], requires_grad=True)
    _SlopeDependsOnUpstream.apply(z).backward()
    assert z.grad.item() == 1.0                                 # with a unit upstream gradient it looks linear
    assert float(upstream_probes(torch.float32).abs().max()) > 1e37
    with pytest.raises(ValueError, match="no exactly saturated regime on the \\+ side"):
        saturation_thresholds("fragile", torch.float32)


def test_a_missed_target_is_reported_by_the_replay_and_counted_as_missed():
    """bfloat16, softplus phi: a non-power-of-two subnormal gradient that the scaled backward product rounds past
    (fl(phi'(g) s') 2^k skips it for every k) is reported as kind "backward", not hidden from the metrics."""
    dtype = torch.bfloat16
    pts = torch.tensor([0.0, 0.5], dtype=torch.float64)
    vals = torch.tensor([-6.03125, 1.0], dtype=torch.float64)
    grads = torch.tensor([[-9.09171411964113e-39], [1.0]], dtype=torch.float64)
    sp = torch.nn.functional.softplus
    net = construct(pts, vals, grads, activation="sigmoid", dtype=dtype, phi=sp)
    assert [(u.point, u.kind) for u in net.unreachable] == [(0, "backward")]
    r = verify(net, pts, vals, grads, phi=sp)
    assert r.exact_grad_frac == 0.5 and r.exact_phi_reachable_grad_frac == 0.5     # phi alone reaches it
    assert r.exact_reachable_grad_frac == 1.0               # the self-certified share (a diagnostic only)


@pytest.mark.parametrize("activation", ["tanh", "gelu"])
def test_replay_report_is_what_verify_returns(activation):
    """The experiment reads the audit's report instead of verifying twice: it must equal a fresh verify()."""
    pts = _grid()[::2]
    mse = lambda y: (y - 0.5) ** 2  # noqa: E731
    for dtype in (torch.float32, torch.bfloat16):
        vals, grads = _hard_targets(dtype, len(pts), seed=11)
        for phi in (None, mse):
            net = construct(pts, vals, grads, activation=activation, dtype=dtype, phi=phi)
            r, rep = verify(net, pts, vals, grads, phi=phi), net.replay_report
            for field in ("exact_value", "exact_grad", "value_ulps", "grad_ulps", "unreachable", "phi_unreachable",
                          "zero_sign_mismatch"):
                assert torch.equal(getattr(r, field), getattr(rep, field)), field
            assert r.nonfinite == rep.nonfinite


@pytest.mark.parametrize("activation", ["tanh", "sigmoid"])
def test_slope_scaling_bounds_the_backward_pass_at_the_other_points(activation):
    """Through MSE, phi'(g_q) = 2 (g_q - 1/2) = 2e10 at the point with value 1e10, while the target 1e36 of another
    point has phi'(g_p) = 1. The scaling 2^k of that target must keep phi'(g_q) s / 2^k finite at q too: bounded with
    phi'(g_p) alone (k = 0), q's flat units see 2e10 * 1e36 = inf in float32 and return inf x 0 = NaN."""
    def mse(y):
        return (y - 0.5) ** 2

    pts = torch.tensor([-0.5, 0.0, 0.5], dtype=torch.float64)
    vals = torch.tensor([1.0, 1e10, -2.0], dtype=torch.float32).double()
    grads = torch.tensor([[1e36], [3.0], [-0.25]], dtype=torch.float32).double()
    net = construct(pts, vals, grads, activation=activation, dtype=torch.float32, phi=mse)
    assert net.unreachable == []
    assert float(net.scale[0, 0]) > 1.0                                  # the big target needed its own 2^k
    x = pts.float().requires_grad_(True)
    out = net(x)
    mse(out).sum().backward()
    assert same_bits(out.detach(), vals.float())
    assert same_bits(x.grad, grads[:, 0].float())
