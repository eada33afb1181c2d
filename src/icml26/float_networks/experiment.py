"""Reproduction: bit-exact values and autodiff gradients per activation and format, against two float baselines.

**Domains.** float32: ``n_float32`` random points in [-1, 1] (seeded); float16 and bfloat16: the 128 multiples of
2^-6 in [-1, 1) (denser float16 domains overflow the gadget's scale K: the README's range note). In the full
preset also 2-D product grids (float32 20 x 20; float16 / bfloat16 8 x 8 multiples of 1/8).

**Targets** (per seed, representable in the format): values and gradients ~ 10 N(0, 1), with hard ones mixed in
(share ``hard_share``): values +-Omega/8 (Omega the largest float; not powers of two), a power-of-two and a
non-power-of-two subnormal, +0 and -0; gradients the same.

**phi:** identity, MSE phi(y) = (y - 1/2)^2 and softplus. With the identity every target is in reach; through MSE
or softplus some gradient targets are out of reach of any float slope (phi'(g) = 0, or rounding skips v: kind
"phi", decided from phi and the targets alone). Every build runs with the audit on: it replays the network's real
backward pass on the domain and reports what it misses (kind "backward"); no metric uses that report as its
denominator.

**Arms.** ``construct_<activation>`` for ReLU, ELU, GELU, SiLU, sigmoid and tanh (the paper's list) and softplus,
Mish and hardswish (registered through ``register_activation``); ``naive``: the textbook
real-arithmetic ReLU interpolant (slope s_p on a small interval around each point, straight pieces between),
weights computed in float64 and run in the format; ``sobolev``: a tanh MLP (2 x 64) trained on values and
gradients, run in the format. Metrics: exact fractions (worst and best format), ulp distances, the shares of
targets reported unreachable by kind, -0/+0 mismatches (``zero_sign_mismatch_frac``: IEEE-equal, bitwise
different), non-finite counts (the ulp maxima are over finite outputs; ``finite_frac`` says how many there were),
build time.

**Per-point outcomes** (unit ``points``: every domain point of every format, and of the 2-D grids in full mode,
in the order format by format; 0/1 each, pooled over seeds by the claims):

- ``construct_<activation>.exact_grad``: every component of the autodiff gradient at the point hits its target
  (identity phi; an unreachable target counts as missed);
- ``registered.exact_grad``: the same for softplus, Mish and hardswish together (every one hits the point);
- ``constructions.exact_value``: every construction (nine activations x three phi) hits the point's value;
- ``constructions.phi_exact_reachable_grad``: through MSE and softplus, every gradient target that some float
  slope reaches through phi (kind "phi" excluded, decided before any network is built) is hit, in every one of the
  paper's six activations (a point with none reachable counts as hit);
- on the 1-D domains only, paired with the baselines: ``construct_relu.exact_value_1d`` / ``exact_grad_1d``,
  ``sobolev.exact_value`` and ``naive.exact_grad``.

**Unit ids** (:func:`point_ids`): seed, format, dimension and coordinates; the seed draws the targets, so no point
is the same unit on two seeds. The metrics over every point carry the unit's ids (``unit_ids["points"]``); with
the 2-D grids (full preset) the 1-D-only metrics list fewer points and carry their own
(``unit_ids["arm.metric"]``, the 1-D points' ids: ``ONE_D_METRICS``). No held-out set: a construction (and the
Sobolev baseline, which is asked to represent the targets at these very points) is evaluated on the points it
is built from by design.

Example:
    >>> import dataclasses
    >>> from icml26.float_networks.experiment import PRESETS, run
    >>> cfg = dataclasses.replace(PRESETS["smoke"], activations=("relu",), n_float32=16, sobolev_steps=2)
    >>> run(cfg).metrics["construct_relu"]["worst_exact_value_frac"]
    1.0
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..common.plotting import new_figure, save_figure
from ..common.progress import progress
from ..common.results import SeedRun
from .baselines import SobolevMLP, hermite_relu_network
from .construct import ACTIVATIONS, construct
from .verify import VerificationResult, verify

PAPER_ACTIVATIONS = ("relu", "elu", "gelu", "silu", "sigmoid", "tanh")
REGISTERED = ("softplus", "mish", "hardswish")

FORMATS = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: the per-point metrics of the 1-D domains only (the baselines and the construction they are paired with)
ONE_D_METRICS = ("construct_relu.exact_value_1d", "construct_relu.exact_grad_1d", "naive.exact_grad",
                 "sobolev.exact_value")
PHIS: dict[str, Callable[[torch.Tensor], torch.Tensor] | None] = {
    "identity": None, "mse": lambda y: (y - 0.5) ** 2, "softplus": torch.nn.functional.softplus}


@dataclass
class Config:
    """Settings of one seed's run (``PRESETS`` holds smoke / quick / full)."""

    seed: int = 0
    """seed of the float32 points and of every target"""
    activations: tuple[str, ...] = PAPER_ACTIVATIONS + REGISTERED
    """activations constructed (the paper's six, then the registered ones)"""
    n_float32: int = 1000
    """random float32 domain points"""
    hard_share: float = 0.3
    """share of hard targets (near Omega/8, subnormal, signed zero)"""
    sobolev_steps: int = 300
    """Adam steps of the Sobolev baseline"""
    two_d: bool = False
    """also 2-D product grids"""


PRESETS: dict[str, Config] = {
    "smoke": Config(n_float32=64, sobolev_steps=20),
    "quick": Config(),
    "full": Config(n_float32=4000, sobolev_steps=2000, two_d=True),
}


def domain(fmt: str, seed: int, cfg: Config, dim: int = 1) -> torch.Tensor:
    """The domain points of a format (float64 tensor of representable values)."""
    dtype = FORMATS[fmt]
    if dim == 2:
        side = (torch.arange(20) / 20.0) if fmt == "float32" else (torch.arange(8) / 8.0)
        grid = torch.stack(torch.meshgrid(side, side, indexing="ij"), -1).reshape(-1, 2)
        return grid.to(dtype).double()
    if fmt == "float32":
        g = torch.Generator().manual_seed(seed)
        pts = torch.unique((torch.rand(cfg.n_float32, generator=g, dtype=torch.float64) * 2 - 1).to(dtype))
        return pts.double()
    return (torch.arange(-64, 64, dtype=torch.float64) / 64).to(dtype).double()


def targets(n: int, dim: int, dtype: torch.dtype, rng: np.random.Generator,
            hard_share: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Values (n,) and gradients (n, dim), representable in ``dtype``, with hard cases mixed in."""
    fi = torch.finfo(dtype)
    vals = rng.normal(size=n) * 10
    grads = rng.normal(size=(n, dim)) * 10
    hard_v = [fi.max / 8, -fi.max / 8, fi.tiny / 4, -fi.tiny * 0.3, 0.0, -0.0]
    hard_g = [fi.max / 8, -fi.max / 8, fi.tiny / 8, fi.tiny * 0.3, -0.0, 0.0]
    pick = rng.random(n) < hard_share
    vals[pick] = rng.choice(hard_v, size=int(pick.sum()))
    pick_g = rng.random((n, dim)) < hard_share
    grads[pick_g] = rng.choice(hard_g, size=int(pick_g.sum()))
    return (torch.tensor(vals).to(dtype).double(), torch.tensor(grads).to(dtype).double())


def _record(into: dict[str, list[float]], fmt: str, r: VerificationResult) -> None:
    into.setdefault("value", []).append(r.exact_value_frac)
    into.setdefault("grad", []).append(r.exact_grad_frac)
    into.setdefault("phi_reach_grad", []).append(r.exact_phi_reachable_grad_frac)
    into.setdefault("unreachable", []).append(1 - r.reachable_frac)
    phi_u = float(r.phi_unreachable.double().mean()) if r.phi_unreachable is not None else 0.0
    into.setdefault("phi_unreachable", []).append(phi_u)
    into.setdefault("backward_unreachable", []).append(1 - r.reachable_frac - phi_u)
    into.setdefault("zero_sign", []).append(r.zero_sign_mismatch_frac)
    into.setdefault("ulp_value", []).append(r.max_ulp_value)
    into.setdefault("ulp_grad", []).append(r.max_ulp_grad)
    into.setdefault("nonfinite", []).append(float(r.nonfinite))
    into.setdefault("finite", []).append(1 - r.nonfinite / (r.exact_value.numel() + r.exact_grad.numel()))
    into.setdefault(f"grad_{fmt}", []).append(r.exact_grad_frac)


def _summary(rec: dict[str, list[float]], phi_rec: dict[str, list[float]] | None = None) -> dict[str, float]:
    out = {"worst_exact_value_frac": min(rec["value"]), "best_exact_value_frac": max(rec["value"]),
           "worst_exact_grad_frac": min(rec["grad"]), "best_exact_grad_frac": max(rec["grad"]),
           "unreachable_frac": float(np.mean(rec["unreachable"])),
           "backward_unreachable_frac": float(np.mean(rec["backward_unreachable"])),
           "zero_sign_mismatch_frac": float(np.mean(rec["zero_sign"])),
           "max_ulp_value": max(rec["ulp_value"]), "max_ulp_reachable_grad": max(rec["ulp_grad"]),
           "nonfinite": float(np.sum(rec["nonfinite"])), "finite_frac": float(np.mean(rec["finite"]))}
    out.update({k: float(np.mean(v)) for k, v in rec.items() if k.startswith("grad_")})
    if phi_rec:
        out["phi_exact_reachable_grad_frac"] = min(phi_rec["phi_reach_grad"])
        out["phi_unreachable_frac"] = float(np.mean(phi_rec["phi_unreachable"]))
        out["phi_backward_unreachable_frac"] = float(np.mean(phi_rec["backward_unreachable"]))
        out["phi_worst_exact_value_frac"] = min(phi_rec["value"])
    return out


def _point_ok(exact: torch.Tensor) -> list[float]:
    """Per point: 1.0 when every component is exact (``exact`` is ``(n,)`` or ``(n, d)`` bool)."""
    return exact.reshape(exact.shape[0], -1).all(dim=1).double().tolist()


def point_ids(fmt: str, dim: int, pts: torch.Tensor, seed: int) -> list[str]:
    """What each unit of ``points`` is: the seed, the format, the dimension and the point's coordinates.

    The seed is part of the id because it draws the point's targets (and the float32 domain): the float16 and
    bfloat16 grids repeat on every seed, but with other targets, so a grid point of another seed is another unit.

    Example:
        >>> point_ids("float16", 1, torch.tensor([-0.5, 0.25], dtype=torch.float64), 3)
        ['s3:float16:1d:-0.5', 's3:float16:1d:0.25']
    """
    return [f"s{seed}:{fmt}:{dim}d:" + ",".join(repr(float(x)) for x in p.reshape(-1)) for p in pts]


def run(cfg: Config) -> SeedRun:
    """One seed: every construction, format and phi, and the two baselines, verified point by point."""
    unknown = set(cfg.activations) - set(ACTIVATIONS)
    if not cfg.activations or unknown or not set(PAPER_ACTIVATIONS) & set(cfg.activations):
        raise ValueError(f"activations must be a subset of {sorted(ACTIVATIONS)} with at least one of "
                         f"{PAPER_ACTIVATIONS}, got {cfg.activations}")
    rng = np.random.default_rng([cfg.seed, 12])
    cases = []                                       # (format, dim, points, values, grads)
    for fmt in FORMATS:
        for dim in (1, 2) if cfg.two_d else (1,):
            pts = domain(fmt, cfg.seed, cfg, dim)
            vals, grads = targets(len(pts), dim, FORMATS[fmt], rng, cfg.hard_share)
            cases.append((fmt, dim, pts, vals, grads))
    metrics: dict[str, dict[str, float]] = {}
    curves: dict[str, Any] = {}
    points: dict[str, dict[str, list[float]]] = {}     # per-point 0/1 outcomes, in case order
    value_all = [torch.ones(len(c[2]), dtype=torch.bool) for c in cases]
    phi_all = [torch.ones(len(c[2]), dtype=torch.bool) for c in cases]
    registered_all = [torch.ones(len(c[2]), dtype=torch.bool) for c in cases]
    for act in progress(cfg.activations, desc=f"float_networks seed {cfg.seed}"):
        rec: dict[str, list[float]] = {}
        phi_rec: dict[str, list[float]] = {}
        per = points.setdefault(f"construct_{act}", {})
        t0 = time.perf_counter()
        for i, (fmt, dim, pts, vals, grads) in enumerate(cases):
            for phi in PHIS.values():
                net = construct(pts, vals, grads, activation=act, dtype=FORMATS[fmt], phi=phi, audit=True)
                r = net.replay_report               # the audit's verify() on these points, targets and phi
                _record(rec if phi is None else phi_rec, fmt, r)
                value_all[i] &= r.exact_value
                if phi is None:
                    per.setdefault("exact_grad", []).extend(_point_ok(r.exact_grad))
                    if act in REGISTERED:
                        registered_all[i] &= r.exact_grad.all(dim=1)
                    if act == "relu" and dim == 1:
                        per.setdefault("exact_value_1d", []).extend(_point_ok(r.exact_value))
                        per.setdefault("exact_grad_1d", []).extend(_point_ok(r.exact_grad))
                elif act in PAPER_ACTIVATIONS:
                    phi_all[i] &= (r.exact_grad | r.phi_unreachable).all(dim=1)
        metrics[f"construct_{act}"] = {**_summary(rec, phi_rec), "build_s": time.perf_counter() - t0}
        curves[act] = rec["grad"]
    constructs = [m for a, m in metrics.items() if a.startswith("construct_")]
    paper = [m for a, m in metrics.items() if a.removeprefix("construct_") in PAPER_ACTIVATIONS]
    metrics["constructions"] = {k: min(m[k] for m in constructs) for k in (
        "worst_exact_value_frac", "phi_worst_exact_value_frac", "worst_exact_grad_frac")}
    metrics["constructions"]["phi_exact_reachable_grad_frac"] = min(m["phi_exact_reachable_grad_frac"]
                                                                    for m in paper)
    points["constructions"] = {"exact_value": [v for t in value_all for v in _point_ok(t)],
                               "phi_exact_reachable_grad": [v for t in phi_all for v in _point_ok(t)]}
    registered = [a for a in cfg.activations if a in REGISTERED]
    if registered:
        points["registered"] = {"exact_grad": [v for t in registered_all for v in _point_ok(t)]}
        metrics["registered"] = {"worst_exact_grad_frac": min(metrics[f"construct_{a}"]["worst_exact_grad_frac"]
                                                              for a in registered)}
    # the baselines, 1-D, identity phi
    naive: dict[str, list[float]] = {}
    sob: dict[str, list[float]] = {}
    for fmt, dim, pts, vals, grads in cases:
        if dim != 1:
            continue
        r = verify(hermite_relu_network(pts, vals, grads, dtype=FORMATS[fmt]), pts, vals, grads, dtype=FORMATS[fmt])
        _record(naive, fmt, r)
        points.setdefault("naive", {}).setdefault("exact_grad", []).extend(_point_ok(r.exact_grad))
        mlp = SobolevMLP(seed=cfg.seed).fit(pts, vals, grads, steps=cfg.sobolev_steps)
        r = verify(mlp.in_dtype(FORMATS[fmt]), pts, vals, grads, dtype=FORMATS[fmt])
        _record(sob, fmt, r)
        points.setdefault("sobolev", {}).setdefault("exact_value", []).extend(_point_ok(r.exact_value))
    metrics["naive"] = _summary(naive)
    metrics["sobolev"] = _summary(sob)
    ids = [u for fmt, dim, pts, _, _ in cases for u in point_ids(fmt, dim, pts, cfg.seed)]
    unit_ids: dict[str, list[str]] = {"points": ids}
    ids_1d = [u for fmt, dim, pts, _, _ in cases if dim == 1 for u in point_ids(fmt, dim, pts, cfg.seed)]
    if ids_1d != ids:  # the 2-D grids (full): the 1-D-only metrics list fewer points, with ids of their own
        unit_ids.update({key: ids_1d for key in ONE_D_METRICS
                         if key.partition(".")[2] in points.get(key.partition(".")[0], {})})
    return SeedRun(metrics, series={"per_format": curves}, units={"points": points}, unit_ids=unit_ids)


def plot(runs: list[SeedRun], result: dict[str, Any], out_dir: Path) -> list[Path]:
    """Exact fraction of gradients (identity phi) per arm and format, mean over seeds."""
    fig, ax = new_figure(figsize=(8, 3.6))
    arms = [a for a in result["arms"] if "grad_float32" in result["arms"][a]]
    width = 0.8 / len(FORMATS)
    for j, fmt in enumerate(FORMATS):
        ys = [result["arms"][a][f"grad_{fmt}"]["mean"] for a in arms]
        ax.bar(np.arange(len(arms)) + j * width, ys, width=width, label=fmt)
    ax.set_xticks(np.arange(len(arms)) + width, arms, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("bit-exact autodiff gradients")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7)
    return [save_figure(fig, out_dir / f"{result['mode']}_exact_gradients.png")]
