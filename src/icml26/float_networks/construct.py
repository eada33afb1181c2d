"""Floating-point networks whose values and autodiff input-gradients hit given targets bit for bit.

Given distinct points x_p (a finite domain D), target values g_p and target gradients v_p, :func:`construct`
builds a network f with, *computed in the chosen floating-point format*,

    f(x_p) == g_p     and     D^AD(phi o f)(x_p) == v_p    for every p in D,

where D^AD is the gradient torch's autograd returns. The network is a sum of two gadgets per point,

    f(x) = sum_p g_p I_p(x) + sum_{p,i} s_{p,i} y_{p,i}(x),

with I_p exactly 1 at p and exactly 0 at the other points (AD derivative exactly 0 on D) and y_{p,i} exactly 0 on D
with AD derivative exactly e_i at p and 0 elsewhere. Every forward value and every backward sum at a domain point
then has at most one non-zero term (or two that cancel exactly), so no rounding happens and the summation order
does not matter. Composition with phi: autograd multiplies phi'(g_p), as it computes it, into s_p once, so s_p is
chosen among the floats next to v_p / phi'(g_p) until fl(phi'(g_p) * s_p) == v_p; a target no float reaches is
reported as unreachable, never altered.

Two gadget families, chosen by the activation's exactly saturated regimes (scanned per dtype at build time by
:func:`saturation_thresholds`, never hard-coded):

- **ramp** (ReLU, ELU, GELU, SiLU): A(z) == c and A'(z) == 0 for z <= -B_flat (c = 0, or -1 for ELU), and
  A(z) == z with A'(z) == 1 for z >= B_lin. I_p = A(beta - r1 - r2) rescaled, r1,2 = A(+-K(t - t_p) - m) - c;
  y_{p,i} = A(b + u_i - r1 - r2) - tau I_p with u_i = A(x_i + S) (slope 1 everywhere on D).
- **saturating** (tanh, sigmoid): A(z) == hi, A'(z) == 0 for z >= B_hi; A(z) == lo, A'(z) == 0 for z <= -B_lo;
  a0 = A(0), d0 = A'(0). I_p = [A(K(t - t_p) + m) - A(K(t - t_p) - m)] / (hi - lo);
  y_{p,i} = A(c_u (A(x_i - p_i) - a0) + M - M I_p) - A(M - M I_p), c_u = 1 / d0^2.

``t`` is the input itself in 1-D and a fixed projection w . x (distinct on D) for d > 1. K, m, M, S are powers
of two so that K t is exact; the domain is too dense for the format when K * range would overflow (a
``ValueError`` says so). Every unit's pre-activation on D is audited against the regime it must be in.

Example:
    >>> import torch
    >>> x = torch.tensor([-0.5, 0.25, 0.75])
    >>> net = construct(x, values=torch.tensor([3.0, -1.0, 0.125]), grads=torch.tensor([7.0, 0.0, -2.5]),
    ...                 activation="tanh", dtype=torch.float16)
    >>> xs = x.to(torch.float16).requires_grad_()
    >>> out = net(xs)
    >>> out.sum().backward()
    >>> out.tolist(), xs.grad.tolist()
    ([3.0, -1.0, 0.125], [7.0, 0.0, -2.5])

Reference: Hwang et al., "Floating-Point Networks with Automatic Differentiation Can Represent Almost All
Floating-Point Functions and Their Gradients", ICML 2026 (arXiv 2605.01702). Only the abstract is public; this
construction is the project's own (see the README's Deviations).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": torch.relu, "elu": nn.functional.elu, "gelu": nn.functional.gelu, "silu": nn.functional.silu,
    "sigmoid": torch.sigmoid, "tanh": torch.tanh,
}
RAMP = ("relu", "elu", "gelu", "silu")
SATURATING = ("sigmoid", "tanh")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check(activation: str, dtype: torch.dtype) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be torch.float32, torch.float16 or torch.bfloat16, got {dtype}")


def _value_and_slope(activation: str, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A(z) and autograd's A'(z), elementwise, in z's dtype."""
    z = z.detach().clone().requires_grad_(True)
    y = ACTIVATIONS[activation](z)
    (g,) = torch.autograd.grad(y.sum(), z)
    return y.detach(), g.detach()


def _probes(threshold: float, dtype: torch.dtype, sign: float) -> torch.Tensor:
    top = torch.finfo(dtype).max / 4
    values = [threshold * (1 + j / 8) for j in range(9)]
    k = 1
    while threshold * 2.0 ** k < top:
        values += [threshold * 2.0 ** k, threshold * 2.0 ** k * 1.5]
        k += 1
    return sign * torch.tensor(values, dtype=torch.float64).to(dtype)


def saturation_thresholds(activation: str, dtype: torch.dtype) -> dict[str, float]:
    """The exactly saturated regimes of ``activation`` in ``dtype``, found by scanning powers of two.

    Returns, for the ramp family, ``flat`` (A == flat_value and A' == 0 for z <= -flat), ``flat_value``, ``linear``
    (A(z) == z and A' == 1 for z >= linear); for the saturating family ``hi``/``lo`` thresholds and values and the
    centre value and slope ``a0``, ``d0``. The probes are a sample, so the construction audits its own
    pre-activations as well.

    Raises:
        ValueError: unknown activation or dtype, or no threshold found (the activation has no such regime here).
    """
    _check(activation, dtype)

    def first(sign: float, ok: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], bool]) -> float:
        for k in range(-3, 12):
            z = _probes(2.0 ** k, dtype, sign)
            y, g = _value_and_slope(activation, z)
            if ok(z, y, g):
                return 2.0 ** k
        raise ValueError(f"{activation} has no exactly saturated regime on the {'+' if sign > 0 else '-'} side in "
                         f"{dtype} (scanned thresholds up to 2^11)")

    if activation in RAMP:
        flat_value = float(ACTIVATIONS[activation](torch.tensor(-1e4, dtype=torch.float32)).to(dtype))
        flat = first(-1.0, lambda z, y, g: bool((y == flat_value).all() and (g == 0).all()))
        linear = first(1.0, lambda z, y, g: bool((y == z).all() and (g == 1).all()))
        return {"flat": flat, "flat_value": flat_value, "linear": linear}
    hi_value = float(ACTIVATIONS[activation](torch.tensor(1e4, dtype=dtype)))
    lo_value = float(ACTIVATIONS[activation](torch.tensor(-1e4, dtype=dtype)))
    hi = first(1.0, lambda z, y, g: bool((y == hi_value).all() and (g == 0).all()))
    lo = first(-1.0, lambda z, y, g: bool((y == lo_value).all() and (g == 0).all()))
    a0, d0 = _value_and_slope(activation, torch.zeros(1, dtype=dtype))
    return {"hi": hi, "hi_value": hi_value, "lo": lo, "lo_value": lo_value, "a0": float(a0), "d0": float(d0)}


def _pow2_at_least(v: float) -> float:
    return 2.0 ** math.ceil(math.log2(max(v, 2.0 ** -20)))


def _exact_in(values: torch.Tensor, dtype: torch.dtype, name: str) -> torch.Tensor:
    v = torch.as_tensor(values)
    if not v.dtype.is_floating_point:
        raise TypeError(f"{name} must be a float tensor, got dtype {v.dtype} (convert integers with .float())")
    v64 = v.to(torch.float64)
    if not torch.isfinite(v64).all():
        raise ValueError(f"{name} contains NaN or infinity")
    cast = v64.to(dtype)
    if not torch.isfinite(cast).all():
        bad = int(torch.nonzero(~torch.isfinite(cast))[0, 0])
        raise ValueError(f"{name}[{bad}] = {float(v64.flatten()[bad])} is outside the range of {dtype}")
    moved = cast.to(torch.float64) != v64
    if moved.any():
        bad = int(torch.nonzero(moved.flatten())[0, 0])
        raise ValueError(f"{name}[{bad}] = {float(v64.flatten()[bad])!r} is not representable in {dtype} (nearest "
                         f"{float(cast.flatten()[bad])!r}); round the targets to the format first")
    return cast


@dataclass
class Unreachable:
    """A gradient target that no float slope reaches through phi."""

    point: int
    coordinate: int
    reason: str


@dataclass
class _Plan:
    family: str
    consts: dict[str, float] = field(default_factory=dict)


class FloatNetwork(nn.Module):
    """The constructed network: fixed (non-trainable) parameters, sparse connectivity, one output per input row.

    ``forward(x)``: ``x`` of shape ``(N,)`` (1-D domains) or ``(N, d)``, in the network's dtype; returns ``(N,)``.
    The layers are affine maps and the activation, with sparse connectivity (each unit reads the few units of its
    own point) and the indicator feeding the output directly.

    Attributes:
        unreachable: the gradient targets no slope reaches (their slope is 0), with the reason.
    """

    def __init__(self, activation: str, dtype: torch.dtype, family: str, tensors: dict[str, torch.Tensor],
                 consts: dict[str, float], dim: int, unreachable: list[Unreachable]):
        super().__init__()
        self.activation, self.dtype, self.family, self.dim = activation, dtype, family, dim
        self.consts = consts
        self.unreachable = unreachable
        for name, t in tensors.items():
            self.register_buffer(name, t.to(dtype))
        self.act = ACTIVATIONS[activation]

    def _c(self, name: str) -> torch.Tensor:
        return torch.tensor(self.consts[name], dtype=self.dtype)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if x.ndim == 1:
            x = x[:, None]
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"x must have shape (N,) or (N, {self.dim}), got {tuple(x.shape)}")
        if x.dtype != self.dtype:
            raise TypeError(f"x must be {self.dtype} (the network's format), got {x.dtype}")
        t = x[:, 0] if self.dim == 1 else (x * self.w).sum(-1)      # t = w . x, distinct on D
        return x, t

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, t = self.project(x)
        A = self.act
        if self.family == "ramp":
            c = self._c("c")
            a = t[:, None] * self._c("K") - self.kp                   # K t exact (K a power of two); 0 at p
            r1 = A(a - self._c("m")) - c                              # A(K(t - t_p) - m) - c: 0 at p
            r2 = A(-a - self._c("m")) - c                             # A(K(t_p - t) - m) - c: 0 at p
            u = A(x + self._c("S"))                                   # slope-1 unit, (N, d)
            i_raw = A(self._c("beta") - r1 - r2)                      # beta at p, c elsewhere
            z = A(self.bz[None] + u[:, None, :] - r1[..., None] - r2[..., None])   # tau at p, c elsewhere
            e = i_raw - c
            ind = e * self._c("inv_span")                             # exactly 1 at p, 0 elsewhere
            y = (z - c) - self.k[None] * e[..., None]                 # exactly 0 on D
        else:
            a = t[:, None] * self._c("K") - self.kp                   # 0 at p
            h1 = A(a + self._c("m"))                                  # A(K(t - t_p) + m): hi at p
            h2 = A(a - self._c("m"))                                  # A(K(t - t_p) - m): lo at p
            ind = h1 * self._c("inv_span") - h2 * self._c("inv_span")
            u = A(x[:, None, :] - self.points[None])                  # A(x_i - p_i): a0 at p, slope d0
            v = u * self._c("cu") - self._c("cu_a0")                  # 0 at p
            ay = A((v + self._c("M")) - ind[..., None] * self._c("M"))   # A(0) = a0 at p, hi elsewhere
            y = (ay - self._c("hi")) + ind[..., None] * self._c("ha")   # exactly 0 on D
        # f(x) = sum_p g_p I_p(x) + sum_{p,i} s_{p,i} y_{p,i}(x)
        return (ind * self.g[None]).sum(-1) + (y * self.s[None]).sum((-2, -1))


def _pairwise_gap(t: torch.Tensor) -> float:
    s = torch.sort(t.to(torch.float64)).values
    return float((s[1:] - s[:-1]).min()) if len(s) > 1 else 1.0


def construct(points: torch.Tensor, values: torch.Tensor, grads: torch.Tensor | None = None, *,
              activation: str = "relu", dtype: torch.dtype = torch.float32,
              phi: Callable[[torch.Tensor], torch.Tensor] | None = None, search_ulps: int = 64,
              audit: bool = True) -> FloatNetwork:
    """Build a network whose float values and autodiff gradients (through ``phi``) hit the targets exactly.

    Args:
        points: ``(n,)`` or ``(n, d)`` distinct domain points, representable in ``dtype``.
        values: ``(n,)`` target values g_p (representable in ``dtype``).
        grads: ``(n,)`` or ``(n, d)`` target gradients v_p of phi o f (representable); default zeros.
        activation: ``"relu"``, ``"elu"``, ``"gelu"``, ``"silu"``, ``"sigmoid"`` or ``"tanh"``.
        dtype: ``torch.float32``, ``torch.float16`` or ``torch.bfloat16``.
        phi: an outer function applied to f (e.g. a loss); default the identity.
        search_ulps: how many floats on each side of v / phi'(g) the slope search tries.
        audit: verify the built network on D (values and autodiff gradients) and raise if any reachable target
            is missed.

    Returns:
        a :class:`FloatNetwork`; its ``unreachable`` lists the gradient targets no slope reaches through phi.

    Raises:
        ValueError: duplicate points, non-finite or unrepresentable targets, mismatched shapes, an unknown
            activation or dtype, a domain too dense for the dtype's range.
        TypeError: non-float inputs.
        RuntimeError: the audit found a missed target (the activation's kernels break an assumption).
    """
    _check(activation, dtype)
    pts = _exact_in(points, dtype, "points")
    if pts.ndim == 1:
        pts = pts[:, None]
    if pts.ndim != 2 or pts.shape[0] == 0:
        raise ValueError(f"points must have shape (n,) or (n, d) with n >= 1, got {tuple(torch.as_tensor(points).shape)}")
    n, d = pts.shape
    g = _exact_in(values, dtype, "values").reshape(-1)
    if g.shape[0] != n:
        raise ValueError(f"values must have {n} entries (one per point), got {g.shape[0]}")
    v = torch.zeros(n, d, dtype=dtype) if grads is None else _exact_in(grads, dtype, "grads").reshape(n, -1)
    if v.shape != (n, d):
        raise ValueError(f"grads must have shape ({n},) or ({n}, {d}), got {tuple(torch.as_tensor(grads).shape)}")
    if len(torch.unique(pts, dim=0)) != n:
        raise ValueError("points has duplicate rows")

    # the projection t = w . x: the input itself in 1-D; (1, 2^-k, 2^-2k, ...) for d > 1, distinct on D
    w = torch.ones(1, dtype=dtype)
    if d == 1:
        t = pts[:, 0]
    else:
        for k in range(4, 40, 2):
            w = torch.tensor([2.0 ** (-k * i) for i in range(d)], dtype=torch.float64).to(dtype)
            t = (pts * w).sum(-1)
            if len(torch.unique(t)) == n:
                break
        else:
            raise ValueError(f"no projection w . x separates the points in {dtype}; the domain is too dense")
    if len(torch.unique(t)) != n:
        raise ValueError(f"the points collide in {dtype} after projection")
    gap = _pairwise_gap(t)
    span = float(t.to(torch.float64).max() - t.to(torch.float64).min()) + gap
    sat = saturation_thresholds(activation, dtype)
    family = "ramp" if activation in RAMP else "saturating"
    big = torch.finfo(dtype).max
    tensors: dict[str, torch.Tensor] = {"w": w}
    if family == "ramp":
        c = sat["flat_value"]
        m = 2 * sat["flat"]                                     # margin: pre-activations at p stay deep in the flat
        T = _pow2_at_least(max(sat["linear"], 1.0)) * 2         # z(p) ~ T: linear regime
        beta = _pow2_at_least(T - c) + c                        # I_raw(p) = A(beta) = beta; beta - c a power of 2
        inv_span = 1.0 / (beta - c)
        xmax = float(pts.to(torch.float64).abs().max())
        S = _pow2_at_least(sat["linear"] + xmax) * 2            # u = A(x + S): linear regime on D
        # at q != p: z(q) <= T + |du| - (K gap - m) and beta - (K gap - m) must be <= -flat
        need = T + 2 * xmax + m + sat["flat"] + beta
        K = _pow2_at_least(need / gap)
        consts = {"c": c, "K": K, "S": S, "beta": beta, "inv_span": inv_span, "m": m}
        u_p = ACTIVATIONS[activation](pts + torch.tensor(S, dtype=dtype))       # u at each point, (n, d)
        bz = torch.tensor(T, dtype=dtype) - u_p                                   # z(p) = fl(bz + u(p))
        tensors["bz"] = bz
        z_p = ACTIVATIONS[activation](bz + u_p)
        tensors["k"] = (z_p - torch.tensor(c, dtype=dtype)) * torch.tensor(inv_span, dtype=dtype)
        # where the slope passes on its way back: A' at z(p), then A' at u's pre-activation x + S
        chain = [bz + u_p, pts + torch.tensor(S, dtype=dtype)]
    else:
        hi_v, lo_v, a0, d0 = sat["hi_value"], sat["lo_value"], sat["a0"], sat["d0"]
        if not (_is_pow2(hi_v - lo_v) and _is_pow2(hi_v - a0) and d0 > 0 and _is_pow2(d0)):
            raise ValueError(f"{activation} in {dtype}: hi - lo, hi - A(0) and A'(0) must be powers of two")
        m = 2 * max(sat["hi"], sat["lo"])
        cu = 1.0 / (d0 * d0)
        M = _pow2_at_least(sat["hi"] + cu * (hi_v - lo_v)) * 2
        need = m + max(sat["hi"], sat["lo"])
        K = _pow2_at_least(need / gap)
        consts = {"K": K, "inv_span": 1.0 / (hi_v - lo_v), "cu": cu, "cu_a0": cu * a0, "M": M, "hi": hi_v,
                  "ha": hi_v - a0, "d0": d0, "m": m}
        tensors["points"] = pts
        zero = torch.zeros_like(pts)
        chain = [zero, torch.full_like(pts, cu), zero]         # A'(0), times cu, A'(0)
    kt = t * torch.tensor(K, dtype=dtype)
    if not torch.isfinite(kt).all() or K * span + consts["m"] > big:
        raise ValueError(f"the domain is too dense for {dtype}: it needs K = {K:g} (minimum gap {gap:g} between "
                         f"points), and K times the domain's span overflows the format")
    tensors["kp"] = kt
    # slopes: D^AD(phi o f)(p) = fl(phi'(g_p) * s_p); search the floats next to v / phi'(g_p)
    s, unreachable = _slopes(g, v, phi, dtype, search_ulps)
    unreachable += _backward_limits(activation, family, consts, tensors, g, s, phi_slope(phi, g), chain, dtype)
    tensors["g"], tensors["s"] = g, s
    net = FloatNetwork(activation, dtype, family, tensors, consts, d, unreachable)
    if audit:
        _audit(net, pts, v, phi)
    return net


def _is_pow2(v: float) -> bool:
    return v > 0 and math.frexp(v)[0] == 0.5


def phi_slope(phi: Callable[[torch.Tensor], torch.Tensor] | None, g: torch.Tensor) -> torch.Tensor:
    """phi'(g) elementwise, as autograd computes it in g's dtype (ones for the identity)."""
    if phi is None:
        return torch.ones_like(g)
    gg = g.detach().clone().requires_grad_(True)
    out = phi(gg)
    if out.shape != gg.shape:
        raise ValueError("phi must act elementwise (same output shape as input)")
    (d,) = torch.autograd.grad(out.sum(), gg)
    return d.detach()


def _slopes(g: torch.Tensor, v: torch.Tensor, phi: Callable[[torch.Tensor], torch.Tensor] | None,
            dtype: torch.dtype, search_ulps: int) -> tuple[torch.Tensor, list[Unreachable]]:
    d = phi_slope(phi, g)                                             # (n,)
    if phi is None:
        return v.clone(), []
    s = torch.zeros_like(v)
    unreachable: list[Unreachable] = []
    for p in range(v.shape[0]):
        dp = d[p]
        for i in range(v.shape[1]):
            target = v[p, i]
            if float(target) == 0.0:
                continue                                              # s = 0 gives an exact zero
            if float(dp) == 0.0 or not math.isfinite(float(dp)):
                unreachable.append(Unreachable(p, i, f"phi'(g) = {float(dp)} at g = {float(g[p])}"))
                continue
            guess = (target.to(torch.float64) / dp.to(torch.float64)).to(dtype)
            if not torch.isfinite(guess):
                unreachable.append(Unreachable(p, i, "v / phi'(g) overflows the format"))
                continue
            cands = _neighbours(guess, search_ulps)
            hit = (cands * dp) == target
            if not hit.any():
                unreachable.append(Unreachable(p, i, f"rounding skips the target: no float s within {search_ulps} "
                                                     f"ulps of v / phi'(g) gives fl(phi'(g) * s) == v"))
                continue
            s[p, i] = cands[hit][0]
    return s, unreachable


def _neighbours(x: torch.Tensor, k: int) -> torch.Tensor:
    """``x`` and the k floats on each side of it, ordered by distance."""
    out = [x]
    lo = hi = x
    inf = torch.tensor(math.inf, dtype=x.dtype)
    for _ in range(k):
        lo, hi = torch.nextafter(lo, -inf), torch.nextafter(hi, inf)
        out += [hi, lo]
    c = torch.stack(out)
    return c[torch.isfinite(c)]


def _backward_limits(activation: str, family: str, consts: dict[str, float], tensors: dict[str, torch.Tensor],
                     g: torch.Tensor, s: torch.Tensor, dphi: torch.Tensor, chain: list[torch.Tensor],
                     dtype: torch.dtype) -> list[Unreachable]:
    """Gradient targets the backward pass cannot carry: their slope is set to 0 and they are reported.

    Two causes: an intermediate of the backward pass at p overflows (|phi'(g)| times |g| or |s| times a gadget
    weight beyond the format's maximum; inf times the flat units' zero slope is NaN), or the activation's backward
    kernel does not return the slope exactly (replayed here with the real kernel, e.g. a subnormal slope flushed
    to zero, or rounded by A'(0) = 1/4).
    """
    big = torch.finfo(dtype).max / 2
    d64 = dphi.to(torch.float64).abs()
    g64, s64 = g.to(torch.float64).abs(), s.to(torch.float64).abs()
    # every point's backward pass meets every gadget: phi'(g_p) times gadget q's weights (g_q, s_q) must stay
    # finite before the flat units' zero slope removes it (inf * 0 = NaN); ReLU's backward selects instead of
    # multiplying, so it never turns an overflow into NaN
    if family == "ramp":
        weights = g64 * consts["inv_span"] + (tensors["k"].to(torch.float64).abs() * s64).sum(-1) + s64.sum(-1)
        own = s64
    else:
        # at other points the gated unit is saturated (zero slope) before the gate weight M is applied
        weights = g64 * consts["inv_span"] + (s64 * consts["ha"]).sum(-1)
        own = s64 * max(consts["d0"] * consts["cu"], consts["d0"] * consts["M"], 1.0)
    if activation == "relu":
        cross = torch.zeros_like(s, dtype=torch.bool)
        own_over = torch.zeros_like(s, dtype=torch.bool)
    else:
        cross = (d64 * weights.max() > big)[:, None].expand_as(s).clone()
        own_over = d64[:, None] * own > big
    # replay the slope's way back through the activation's real backward kernel
    grad = (s * dphi[:, None]).to(dtype)
    for k, step in enumerate(chain):
        if family == "saturating" and k == 1:
            grad = grad * step
            continue
        z = step.detach().clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(ACTIVATIONS[activation](z), z, grad_outputs=grad)
    lossy = (grad != (s * dphi[:, None]).to(dtype)) & ~own_over & (s != 0)
    out = []
    for p, i in torch.nonzero(cross | own_over | lossy).tolist():
        if own_over[p, i]:
            reason = "the backward pass would overflow (|phi'(g)| times |s| beyond the format's maximum)"
        elif lossy[p, i]:
            reason = (f"{activation}'s backward kernel does not carry this slope exactly in {dtype} (a subnormal "
                      "flushed or rounded)")
        else:
            reason = ("another target's gadget overflows this point's backward pass (|phi'(g_p)| times the "
                      "largest |g_q| or |s_q| beyond the format's maximum)")
        out.append(Unreachable(p, i, reason))
        if own_over[p, i] or lossy[p, i]:
            s[p, i] = 0
    return out


def _audit(net: FloatNetwork, pts: torch.Tensor, grads: torch.Tensor,
           phi: Callable[[torch.Tensor], torch.Tensor] | None) -> None:
    """Verify values and gradients on D; raise if a reachable target is missed."""
    from .verify import verify

    report = verify(net, pts, net.g, grads, phi=phi)
    if report.exact_value_frac < 1.0 or report.exact_reachable_grad_frac < 1.0:
        raise RuntimeError(f"construction audit failed for {net.activation} in {net.dtype}: {report.summary()}; "
                           "the activation's kernels break a saturation assumption at this scale")
