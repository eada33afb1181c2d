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
reported as unreachable (kind "phi"), never altered.

Per-point power-of-two scaling: the slope unit of target (p, i) reads 2^k x_i and the output slope is s / 2^k,

    y_{p,i}'s unit = A(2^k (x_i - p_i))  (saturating)   or   A(2^k x_i + S)  (ramp, k <= 0),

with k chosen per target so every backward intermediate stays finite at every point and normal at p (targets near
the largest float would overflow the gate weight, inf x 0 = NaN; subnormal ones are flushed or rounded by some
kernels). The audit replays the built network's real backward pass on D and reports what it misses (kind
"backward"); no target is declared unreachable by a static estimate.

Two gadget families, chosen by the activation's exactly saturated regimes (scanned per dtype, with large upstream
gradients, by :func:`saturation_thresholds`, never hard-coded):

- **ramp** (ReLU, ELU, GELU, SiLU, softplus, Mish, hardswish): A(z) == c and A'(z) == 0 for z <= -B_flat
  (c = 0, or -1 for ELU), and
  A(z) == z with A'(z) == 1 for z >= B_lin. I_p = A(beta - r1 - r2) rescaled, r1,2 = A(+-K(t - t_p) - m) - c;
  y_{p,i} = A(b + u_i - r1 - r2) - tau I_p with u_i = A(2^k x_i + S) (slope 2^k everywhere on D).
- **saturating** (tanh, sigmoid): A(z) == hi, A'(z) == 0 for z >= B_hi; A(z) == lo, A'(z) == 0 for z <= -B_lo;
  a0 = A(0), d0 = A'(0). I_p = [A(K(t - t_p) + m) - A(K(t - t_p) - m)] / (hi - lo);
  y_{p,i} = A(c_u (A(2^k (x_i - p_i)) - a0) + M - M I_p) - A(M - M I_p), c_u = 1 / d0^2.

``t`` is the input itself in 1-D and a fixed projection w . x (distinct on D) for d > 1. K, m, M, S are powers
of two so that K t is exact; the domain is too dense for the format when K * range would overflow (a
``ValueError`` says so). New activations join through :func:`register_activation`.

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

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": torch.relu, "elu": nn.functional.elu, "gelu": nn.functional.gelu, "silu": nn.functional.silu,
    "sigmoid": torch.sigmoid, "tanh": torch.tanh, "softplus": nn.functional.softplus, "mish": nn.functional.mish,
    "hardswish": nn.functional.hardswish,
}
#: gadget family of each registered activation ("ramp": flat then identity; "saturating": two flat sides)
FAMILIES: dict[str, str] = {"relu": "ramp", "elu": "ramp", "gelu": "ramp", "silu": "ramp", "softplus": "ramp",
                            "mish": "ramp", "hardswish": "ramp", "sigmoid": "saturating", "tanh": "saturating"}
RAMP = ("relu", "elu", "gelu", "silu")            # the paper's named activations, by family
SATURATING = ("sigmoid", "tanh")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def register_activation(name: str, fn: Callable[[torch.Tensor], torch.Tensor], family: str) -> None:
    """Make ``fn`` available to :func:`construct` as ``activation=name``.

    The construction's guarantees carry over unchanged: :func:`saturation_thresholds` scans ``fn``'s exactly
    saturated regimes in each format (with large upstream gradients), and every build replays the real backward
    pass on the domain, reporting any target it misses.

    Args:
        name: the activation's name (a new one, or an existing one to replace).
        fn: an elementwise torch function, differentiable by autograd.
        family: ``"ramp"`` (A(z) == const with slope 0 for z <= -B, A(z) == z with slope 1 for z >= B: ReLU-like)
            or ``"saturating"`` (constant with slope 0 on both sides; hi - lo, hi - A(0) and A'(0) powers of two).

    Example:
        >>> register_activation("clamp0", lambda z: torch.clamp(z, min=0.0), "ramp")
        >>> "clamp0" in ACTIVATIONS
        True
        >>> _ = ACTIVATIONS.pop("clamp0"), FAMILIES.pop("clamp0")
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if family not in ("ramp", "saturating"):
        raise ValueError(f"family must be 'ramp' or 'saturating', got {family!r}")
    ACTIVATIONS[name] = fn
    FAMILIES[name] = family


def _check(activation: str, dtype: torch.dtype) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be torch.float32, torch.float16 or torch.bfloat16, got {dtype}")


def _value_and_slope(activation: str, z: torch.Tensor,
                     upstream: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A(z) and autograd's upstream * A'(z) (the real backward kernel), elementwise, in z's dtype (upstream 1)."""
    z = z.detach().clone().requires_grad_(True)
    y = ACTIVATIONS[activation](z)
    up = torch.ones_like(y) if upstream is None else upstream.to(y.dtype).expand_as(y)
    (g,) = torch.autograd.grad(y, z, grad_outputs=up)
    return y.detach(), g.detach()


def _probes(threshold: float, dtype: torch.dtype, sign: float, top: float | None = None) -> torch.Tensor:
    top = torch.finfo(dtype).max / 4 if top is None else top
    values = [threshold * (1 + j / 8) for j in range(9)]
    k = 1
    while threshold * 2.0 ** k < top:
        values += [threshold * 2.0 ** k, threshold * 2.0 ** k * 1.5]
        k += 1
    return sign * torch.tensor(values, dtype=torch.float64).to(dtype)


_MANT_BITS = {torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}


def upstream_probes(dtype: torch.dtype) -> torch.Tensor:
    """Upstream gradients the saturation scan feeds the backward kernel: both signs, mantissas 1, 1.5 and the
    format's largest, in every fourth binade from the smallest normal up and in the top four binades below an
    eighth of the largest float. Subnormal upstream gradients are not probed: some kernels flush them (bfloat16
    GELU), and the construction's per-point power-of-two scaling keeps every slope it passes through a kernel in
    the normal range."""
    fi = torch.finfo(dtype)
    ulp1 = 2.0 ** (1 - _MANT_BITS[dtype])
    emin, emax = math.frexp(fi.tiny)[1] - 1, math.frexp(fi.max)[1] - 4
    exps = sorted(set(range(emin, emax + 1, 4)) | set(range(emax - 3, emax + 1)) | {0})
    vals = [m * 2.0 ** e for e in exps for m in (1.0, 1.5, 2.0 - ulp1)]
    v = torch.tensor(vals, dtype=torch.float64)
    return torch.cat([v, -v]).to(dtype)


def saturation_thresholds(activation: str, dtype: torch.dtype) -> dict[str, float]:
    """The exactly saturated regimes of ``activation`` in ``dtype``, found by scanning powers of two.

    A threshold B is accepted when, at every probe beyond it (B (1 + j/8), then powers of two up to a quarter of
    the largest float) and for every upstream gradient of :func:`upstream_probes` (large, small and subnormal, both
    signs), the forward value is the regime's exactly and the backward kernel returns exactly 0 (flat) or exactly
    the upstream gradient (linear). A unit upstream gradient alone is not enough: a slope just below 1 can round
    to 1 times 1 but not times a large weight.

    Returns, for the ramp family, ``flat`` (A == flat_value and A' == 0 for z <= -flat), ``flat_value``, ``linear``
    (A(z) == z and A' == 1 for z >= linear); for the saturating family ``hi``/``lo`` thresholds and values and the
    centre value and slope ``a0``, ``d0``. Every build still replays its own backward pass on the domain.

    Raises:
        ValueError: unknown activation or dtype, or no threshold found (the activation has no such regime here).
    """
    _check(activation, dtype)
    return dict(_scan(activation, ACTIVATIONS[activation], dtype))


@functools.lru_cache(maxsize=256)
def _scan(activation: str, fn: Callable[[torch.Tensor], torch.Tensor], dtype: torch.dtype) -> tuple:
    up = upstream_probes(dtype)
    big = torch.finfo(dtype).max

    def first(sign: float, ok: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], bool],
              top: float | None = None) -> float | None:
        for k in range(-3, 12):
            z = _probes(2.0 ** k, dtype, sign, top)
            zz = z[:, None].expand(len(z), len(up)).contiguous()
            uu = up[None, :].expand_as(zz)
            y, g = _value_and_slope(activation, zz, uu)
            if ok(zz, y, g, uu):
                return 2.0 ** k
        return None

    def fail(sign: float) -> ValueError:
        return ValueError(f"{activation} has no exactly saturated regime on the {'+' if sign > 0 else '-'} side in "
                          f"{dtype} (scanned thresholds up to 2^11 with large upstream gradients)")

    if FAMILIES[activation] == "ramp":
        flat_value = float(fn(torch.tensor(-1e4, dtype=torch.float32)).to(dtype)) + 0.0
        flat = first(-1.0, lambda z, y, g, u: bool((y == flat_value).all() and (g == 0).all()))
        if flat is None:
            raise fail(-1.0)
        # the linear regime may end before the largest float (hardswish computes z * 6 / 6): the largest power of
        # two up to which it holds is returned as linear_max, and the construction keeps its units below it
        top = big / 4
        while top > 2.0 ** 12:
            linear = first(1.0, lambda z, y, g, u: bool((y == z).all() and (g == u).all()), top)
            if linear is not None:
                break
            top /= 16
        else:
            raise fail(1.0)
        return tuple({"flat": flat, "flat_value": flat_value, "linear": linear, "linear_max": top}.items())
    hi_value = float(fn(torch.tensor(1e4, dtype=dtype)))
    lo_value = float(fn(torch.tensor(-1e4, dtype=dtype)))
    hi = first(1.0, lambda z, y, g, u: bool((y == hi_value).all() and (g == 0).all()))
    lo = first(-1.0, lambda z, y, g, u: bool((y == lo_value).all() and (g == 0).all()))
    if hi is None or lo is None:
        raise fail(1.0 if hi is None else -1.0)
    a0, d0 = _value_and_slope(activation, torch.zeros(1, dtype=dtype))
    return tuple({"hi": hi, "hi_value": hi_value, "lo": lo, "lo_value": lo_value, "a0": float(a0),
                  "d0": float(d0)}.items())


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
    """A gradient target the constructed network does not hit.

    ``kind`` is ``"phi"`` when no float slope s gives fl(phi'(g) s) == v (decided from phi and the targets alone,
    before any network exists), or ``"backward"`` when the replay of the built network's real backward pass on the
    domain misses it (an overflow, NaN, or a kernel that rounds).
    """

    point: int
    coordinate: int
    reason: str
    kind: str = "phi"


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
        unreachable: the gradient targets the network misses, each with its kind ("phi": no float slope reaches it
            through phi; "backward": the replayed backward pass misses it) and reason.
        replay_report: the audit's :class:`~.verify.VerificationResult` on the construction's own domain, targets
            and phi (None without the audit): the same as calling ``verify`` again.
        scale: ``(n, d)`` powers of two 2^k_{p,i}: the per-point slope scaling (output slope s_{p,i} / 2^k).
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
        self.replay_report = None

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
            # slope-1 unit of x_i scaled by 2^k_{p,i} (k <= 0; the output slope is s_{p,i} / 2^k), (N, n, d)
            u = A(x[:, None, :] * self.scale[None] + self._c("S"))
            i_raw = A(self._c("beta") - r1 - r2)                      # beta at p, c elsewhere
            z = A(self.bz[None] + u - r1[..., None] - r2[..., None])   # tau at p, c elsewhere
            e = i_raw - c
            ind = e * self._c("inv_span")                             # exactly 1 at p, 0 elsewhere
            y = (z - c) - self.k[None] * e[..., None]                 # exactly 0 on D
        else:
            a = t[:, None] * self._c("K") - self.kp                   # 0 at p
            h1 = A(a + self._c("m"))                                  # A(K(t - t_p) + m): hi at p
            h2 = A(a - self._c("m"))                                  # A(K(t - t_p) - m): lo at p
            ind = h1 * self._c("inv_span") - h2 * self._c("inv_span")
            # u = A(2^k (x_i - p_i)): a0 at p, slope d0 2^k; the output slope is s_{p,i} / 2^k
            u = A((x[:, None, :] - self.points[None]) * self.scale[None])
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
        audit: replay the built network's real forward and backward pass on D: gradient targets it misses are
            reported in ``unreachable`` (kind "backward"; if zeroing their slopes lets more targets be hit, those
            slopes are zeroed), and a missed value raises. Off: no replay, nothing reported beyond phi.

    Returns:
        a :class:`FloatNetwork`; its ``unreachable`` lists the gradient targets it misses (kind "phi" or
        "backward").

    Raises:
        ValueError: duplicate points, non-finite or unrepresentable targets, mismatched shapes, an unknown
            activation or dtype, a domain too dense for the dtype's range.
        TypeError: non-float inputs.
        RuntimeError: the audit found a missed value (the activation's kernels break an assumption).
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
    family = FAMILIES[activation]
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
        if S + xmax > sat["linear_max"]:
            raise ValueError(f"the domain is too large for {activation}'s linear regime in {dtype} (|x| up to "
                             f"{xmax:g}; the regime ends at {sat['linear_max']:g})")
        consts = {"c": c, "K": K, "S": S, "beta": beta, "inv_span": inv_span, "m": m}
        fixed = {"T": T, "c": c, "inv_span": inv_span, "S": S}
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
        fixed = {}
    kt = t * torch.tensor(K, dtype=dtype)
    if not torch.isfinite(kt).all() or K * span + consts["m"] > big:
        raise ValueError(f"the domain is too dense for {dtype}: it needs K = {K:g} (minimum gap {gap:g} between "
                         f"points), and K times the domain's span overflows the format")
    tensors["kp"] = kt
    # slopes: D^AD(phi o f)(p) = fl(phi'(g_p) * s_p); search the floats next to v / phi'(g_p)
    s, unreachable = _slopes(g, v, phi, dtype, search_ulps)
    dphi = phi_slope(phi, g)
    # per-point power-of-two scaling: the unit reads 2^k x (2^k (x - p) in the saturating family) and the output
    # slope is s / 2^k, so every slope the kernels see is a normal float far from overflow; D^AD(phi o f)(p)
    # = fl(phi'(g_p) s / 2^k) 2^k == fl(phi'(g_p) s), exact because multiplying by 2^k only moves the exponent
    scale = _scales(s, dphi, family, consts, activation, dtype)
    factors = () if family == "ramp" else (consts["d0"], consts["cu"], consts["d0"])
    s_out, scale = _scaled_slopes(s, v, dphi, scale, phi is not None, search_ulps, family == "ramp", factors)
    tensors["scale"] = scale
    if family == "ramp":
        _ramp_units(tensors, pts, scale, fixed, activation, dtype)
    tensors["g"], tensors["s"] = g, s_out
    net = FloatNetwork(activation, dtype, family, tensors, consts, d, unreachable)
    if audit:
        _replay(net, pts, v, phi)
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


def _scales(s: torch.Tensor, dphi: torch.Tensor, family: str, consts: dict[str, float], activation: str,
            dtype: torch.dtype) -> torch.Tensor:
    """Per-target powers of two 2^k: the smallest |k| that keeps every backward intermediate of the slope s / 2^k
    finite at every point (|phi'(g_q)| s / 2^k times the gadget's largest weight below a quarter of the largest
    float) and normal at its own point (|phi'(g_p)| s / 2^k times the smallest factor on the way back at least
    four times the smallest normal, so no kernel meets a subnormal). k <= 0 in the ramp family (the unit reads
    2^k x inside its linear regime)."""
    fi = torch.finfo(dtype)
    lo_exp, hi_exp = math.frexp(fi.tiny)[1] - 1, math.frexp(fi.max)[1] - 1
    d64 = dphi.to(torch.float64).abs()
    d64 = torch.where(torch.isfinite(d64), d64, torch.zeros_like(d64))
    dmax = float(d64.max()) if len(d64) else 1.0
    if family == "ramp":
        up_gain = 2.0 * s.shape[1]          # the gadget weight k <= 1 on each of the d units, plus the unit itself
        lo_gain = 1.0
    else:
        d0, cu, M, ha = consts["d0"], consts["cu"], consts["M"], consts["ha"]
        up_gain = max(1.0, d0 * cu, M * d0 + ha + 1)
        lo_gain = min(1.0, d0, d0 * cu)
    ceiling = math.log2(fi.max / 4)
    floor = math.log2(fi.tiny * 4)
    out = torch.ones_like(s, dtype=torch.float64)
    for (p, i), val in zip(torch.nonzero(s != 0).tolist(), s[s != 0].to(torch.float64).tolist(), strict=True):
        ls = math.log2(abs(val))
        dp = float(d64[p]) if float(d64[p]) > 0 else 1.0
        kmin = math.ceil(ls + math.log2(max(dmax, dp) * up_gain) - ceiling)     # no overflow anywhere
        kmax = math.floor(ls + math.log2(dp * lo_gain) - floor)                # normal at p
        kmax = min(kmax, math.floor(ls - floor))                               # s / 2^k itself normal
        k = 0 if kmin <= 0 <= kmax else (kmin if kmin > 0 else kmax)
        if family == "ramp":
            k = min(k, 0)
        k = max(min(k, hi_exp - 1), lo_exp + 1)                                # 2^k a normal float
        out[p, i] = 2.0 ** k
    return out.to(dtype)


def _scaled_slopes(s: torch.Tensor, v: torch.Tensor, dphi: torch.Tensor, scale: torch.Tensor, has_phi: bool,
                   search_ulps: int, ramp: bool, factors: tuple[float, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """The output slopes s' (and their scales 2^k) with fl(fl(phi'(g) s') 2^k) == v, the product the scaled
    backward pass forms.

    s / 2^k is exact; through a phi it must be searched again when v is subnormal: fl(phi'(g) s / 2^k) 2^k is
    rounded twice, and some subnormals are skipped for one k but not for a neighbouring one, so k +- 1, +- 2 (and
    0) are tried, among the floats next to v / (phi'(g) 2^k).
    """
    dtype = s.dtype
    tiny = torch.finfo(dtype).tiny
    out = (s.to(torch.float64) / scale.to(torch.float64)).to(dtype)
    if not has_phi:
        return out, scale
    scale = scale.clone()
    for p, i in torch.nonzero((scale != 1) & (s != 0)).tolist():
        dp, target = dphi[p], v[p, i]
        if (dp * out[p, i]) * scale[p, i] == target:
            continue
        k0 = round(math.log2(float(scale[p, i])))
        for k in (k0, k0 - 1, k0 + 1, k0 - 2, k0 + 2, 0):
            if ramp and k > 0:
                continue
            k2 = torch.tensor(2.0 ** k, dtype=torch.float64).to(dtype)
            guess = (target.to(torch.float64) / (dp.to(torch.float64) * 2.0 ** k)).to(dtype)
            if not torch.isfinite(guess) or guess == 0:
                continue
            cands = _neighbours(guess, search_ulps)
            first = cands * dp
            chain = first
            for f in factors:                                     # the saturating gadget's d0, cu, d0
                chain = chain * torch.tensor(f, dtype=dtype)
            # hit, with every slope a kernel sees a normal float (some kernels flush subnormals)
            hit = ((chain * k2) == target) & (first.abs() >= tiny) & (chain.abs() >= tiny)
            if hit.any():
                out[p, i], scale[p, i] = cands[hit][0], k2
                break
    return out, scale


def _ramp_units(tensors: dict[str, torch.Tensor], pts: torch.Tensor, scale: torch.Tensor, fixed: dict[str, float],
                activation: str, dtype: torch.dtype) -> None:
    """The ramp gadget's per-target biases for the scaled unit u = A(2^k x + S): z(p) = fl(bz + u(p)) = T."""
    A = ACTIVATIONS[activation]
    u_p = A(pts * scale + torch.tensor(fixed["S"], dtype=dtype))               # u at each point, (n, d)
    bz = torch.tensor(fixed["T"], dtype=dtype) - u_p
    tensors["bz"] = bz
    z_p = A(bz + u_p)
    tensors["k"] = (z_p - torch.tensor(fixed["c"], dtype=dtype)) * torch.tensor(fixed["inv_span"], dtype=dtype)


def _replay(net: FloatNetwork, pts: torch.Tensor, grads: torch.Tensor,
            phi: Callable[[torch.Tensor], torch.Tensor] | None) -> None:
    """Run the real forward and backward pass on D; report the gradient targets it misses as unreachable (kind
    "backward"), zero their slopes when that lets strictly more targets be hit, and raise on a missed value."""
    from .verify import verify

    known = {(u.point, u.coordinate) for u in net.unreachable}
    report = verify(net, pts, net.g, grads, phi=phi)
    if report.exact_value_frac < 1.0:
        raise RuntimeError(f"construction audit failed for {net.activation} in {net.dtype}: {report.summary()}; "
                           "the activation's kernels break a saturation assumption at this scale")
    missed = [(p, i) for p, i in torch.nonzero(~report.exact_grad).tolist() if (p, i) not in known]
    net.replay_report = report
    if not missed:
        return
    saved = net.s.clone()
    for p, i in missed:
        net.s[p, i] = 0
    zeroed = verify(net, pts, net.g, grads, phi=phi)
    if int(zeroed.exact_grad.sum()) > int(report.exact_grad.sum()):
        report = zeroed
        note = "; its slope is zeroed, which lets other targets be hit"
    else:
        net.s.copy_(saved)
        note = ""
    for p, i in torch.nonzero(~report.exact_grad).tolist():
        if (p, i) in known:
            continue
        bad = not math.isfinite(float(report.grad_ulps[p, i]))
        reason = ("the backward pass produces NaN or infinity here (an intermediate overflows before a zero slope "
                  "removes it)" if bad else f"the backward kernels round it ({float(report.grad_ulps[p, i]):g} ulp)")
        net.unreachable.append(Unreachable(p, i, reason + note, kind="backward"))
        report.unreachable[p, i] = True
    net.replay_report = report
