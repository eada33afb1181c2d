"""The contrasts: a real-arithmetic piecewise-linear interpolant and a Sobolev-trained MLP, both run in float.

Example:
    >>> import torch
    >>> net = hermite_relu_network(torch.tensor([0.0, 0.5, 1.0]), torch.tensor([1.0, 2.0, 0.5]),
    ...                            torch.tensor([0.0, 3.0, -1.0]), dtype=torch.float32)
    >>> [round(v, 4) for v in net(torch.tensor([0.0, 0.5, 1.0])).tolist()]
    [1.0, 2.0, 0.5]
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn


class ReLUInterpolant(nn.Module):
    """f(x) = c0 + c1 x + sum_k c_k ReLU(x - t_k), weights given in real arithmetic, evaluated in ``dtype``."""

    def __init__(self, knots: np.ndarray, coefs: np.ndarray, c0: float, c1: float, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype
        self.register_buffer("knots", torch.tensor(knots, dtype=torch.float64).to(dtype))
        self.register_buffer("coefs", torch.tensor(coefs, dtype=torch.float64).to(dtype))
        self.register_buffer("c", torch.tensor([c0, c1], dtype=torch.float64).to(dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 1:
            raise ValueError(f"x must be 1-D, got shape {tuple(x.shape)}")
        x = x.to(self.dtype)
        return self.c[0] + self.c[1] * x + (torch.relu(x[:, None] - self.knots[None]) * self.coefs[None]).sum(-1)


def hermite_relu_network(points: torch.Tensor, values: torch.Tensor, slopes: torch.Tensor, *,
                         dtype: torch.dtype) -> ReLUInterpolant:
    """The textbook construction in real arithmetic: slope s_p on [p - e, p + e] through (p, g_p), straight
    segments in between (e = a quarter of the smallest gap); coefficients computed in float64, then cast."""
    order = np.argsort(points.double().numpy())
    p = points.double().numpy()[order]
    g = values.double().numpy()[order]
    s = slopes.double().reshape(-1).numpy()[order]
    if len(p) < 2:
        raise ValueError("the interpolant needs at least two points")
    e = float(np.min(np.diff(p))) / 4
    knots = [v for k in range(len(p)) for v in (p[k] - e, p[k] + e)]
    # slopes of the pieces: before p0-e (s0), on [p_k-e, p_k+e] (s_k), between (connecting); their changes
    slopes_seq = [s[0]]
    for k in range(len(p)):
        slopes_seq.append(s[k])
        if k + 1 < len(p):
            slopes_seq.append(((g[k + 1] - s[k + 1] * e) - (g[k] + s[k] * e)) / (p[k + 1] - p[k] - 2 * e))
    slopes_seq.append(s[-1])
    # knots where the slope changes: p_k - e (into s_k), p_k + e (out of s_k)
    changes = np.diff(np.array(slopes_seq))
    c1 = s[0]
    c0 = g[0] - s[0] * p[0]
    return ReLUInterpolant(np.array(knots), changes, c0, c1, dtype)


class SobolevMLP(nn.Module):
    """A tanh MLP trained on values and input-gradients (Sobolev training), evaluated in ``dtype``."""

    def __init__(self, width: int = 64, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(1, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(),
                                 nn.Linear(width, 1))
        for m in self.net:
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=1 / math.sqrt(m.in_features), generator=g)
                nn.init.zeros_(m.bias)
        self.register_buffer("scale", torch.ones(2, dtype=torch.float64))
        self.dtype = torch.float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 1:
            raise ValueError(f"x must be 1-D, got shape {tuple(x.shape)}")
        x = x.to(self.dtype)
        return self.net(x[:, None])[:, 0] * self.scale[1].to(self.dtype) + self.scale[0].to(self.dtype)

    def fit(self, points: torch.Tensor, values: torch.Tensor, slopes: torch.Tensor, *, steps: int,
            lr: float = 3e-3) -> SobolevMLP:
        """Adam on mean squared value error + mean squared gradient error (targets standardised)."""
        x = points.double().float().reshape(-1)
        g, s = values.double(), slopes.double().reshape(-1)
        finite = torch.isfinite(g) & torch.isfinite(s) & (g.abs() < 1e30) & (s.abs() < 1e30)
        mu, sigma = float(g[finite].mean()), float(g[finite].std().clamp_min(1e-6))
        self.scale = torch.tensor([mu, sigma], dtype=torch.float64)
        gt, st = ((g - mu) / sigma).float(), (s / sigma).float()
        opt = torch.optim.Adam(self.net.parameters(), lr=lr)
        for _ in range(steps):
            xr = x[finite].clone().requires_grad_(True)
            out = self.net(xr[:, None])[:, 0]
            (grad,) = torch.autograd.grad(out.sum(), xr, create_graph=True)
            loss = ((out - gt[finite]) ** 2).mean() + ((grad - st[finite]) ** 2).mean()
            if not torch.isfinite(loss):
                raise FloatingPointError("Sobolev training loss is not finite")
            opt.zero_grad()
            loss.backward()
            opt.step()
        return self

    def in_dtype(self, dtype: torch.dtype) -> SobolevMLP:
        """This network with weights cast to ``dtype`` (evaluated in it)."""
        import copy

        other = copy.deepcopy(self)
        other.net = other.net.to(dtype)
        other.dtype = dtype
        return other
