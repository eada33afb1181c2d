"""Literal float64 transcriptions of xFedAlign's equations with plain loops (tests only).

- artifact: u_c = S_c / ||S_c||_2; u~ = u + noise; keep the top-k of max(u~, 0); q = round(v / max * 255);
  dense row = q * max / 255 at the kept groups, renormalised to sum 1;
- prior: per class and group, the median (or mean, or trimmed mean) over the clients holding the class,
  rows renormalised, then Pi = rownorm(e Pi_prev + (1 - e) Pi_new);
- alignment: rownorm((1 - beta) rownorm(S) + beta Pi);
- JSD in bits; deletion / insertion AUC of one item by explicit steps and the trapezoid rule;
- the surrogate's soft-label cross-entropy and its gradient.

Example:
    >>> round(jsd_reference([1.0, 0.0], [0.0, 1.0]), 12)
    1.0
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence


def _rownorm(row: Sequence[float]) -> list[float]:
    s = sum(row)
    return [v / s for v in row] if s > 0 else [1.0 / len(row)] * len(row)


def artifact_dense_reference(S: Sequence[Sequence[float]], topk: int, noise: Sequence[Sequence[float]] | None = None,
                             bits: int = 8) -> list[list[float]]:
    """The dequantised, renormalised (C, G) map a client's artifact stands for."""
    C, G = len(S), len(S[0])
    U = []
    for c in range(C):
        norm = math.sqrt(sum(v * v for v in S[c]))
        row = [v / norm if norm > 0 else 1.0 / math.sqrt(G) for v in S[c]]
        if noise is not None:
            row = [v + noise[c][g] for g, v in enumerate(row)]
        U.append([max(v, 0.0) for v in row])
    kept = []
    for c in range(C):
        order = sorted(range(G), key=lambda g: (-U[c][g], g))[:topk]
        kept.append([(g, U[c][g]) for g in order])
    scale = max(v for row in kept for _, v in row)
    scale = scale if scale > 0 else 1.0
    levels = 2**bits - 1
    out = []
    for c in range(C):
        dense = [0.0] * G
        for g, v in kept[c]:
            dense[g] = round(v / scale * levels) * scale / levels
        out.append(_rownorm(dense))
    return out


def _median(values: list[float]) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def prior_reference(maps: Sequence[Sequence[Sequence[float]]], present: Sequence[Sequence[bool]], method: str,
                    trim: float = 0.2, prev: Sequence[Sequence[float]] | None = None, ema: float = 0.6
                    ) -> list[list[float]]:
    """The aggregated prior by loops (see the module docstring)."""
    N, C, G = len(maps), len(maps[0]), len(maps[0][0])
    rows = [[_rownorm(maps[i][c]) for c in range(C)] for i in range(N)]
    out = []
    for c in range(C):
        holders = [i for i in range(N) if present[i][c]]
        new = []
        for g in range(G):
            vals = [rows[i][c][g] for i in holders]
            if method == "median":
                new.append(_median(vals))
            elif method == "mean":
                new.append(sum(vals) / len(vals))
            else:
                cut = math.floor(trim * len(vals))
                s = sorted(vals)[cut:len(vals) - cut]
                new.append(sum(s) / len(s))
        out.append(_rownorm(new))
    if prev is None:
        return out
    return [_rownorm([ema * prev[c][g] + (1 - ema) * out[c][g] for g in range(G)]) for c in range(C)]


def align_reference(S: Sequence[float], prior: Sequence[float], beta: float) -> list[float]:
    s, p = _rownorm([abs(v) for v in S]), _rownorm(list(prior))
    return _rownorm([(1 - beta) * a + beta * b for a, b in zip(s, p, strict=True)])


def jsd_reference(p: Sequence[float], q: Sequence[float]) -> float:
    m = [(a + b) / 2 for a, b in zip(p, q, strict=True)]
    kl = lambda a: sum(x * math.log2(x / y) for x, y in zip(a, m, strict=True) if x > 0)  # noqa: E731
    return 0.5 * kl(p) + 0.5 * kl(q)


def deletion_insertion_reference(proba: Callable[[list[float]], list[float]], x: Sequence[float],
                                 scores: Sequence[float], groups: Sequence[Sequence[int]],
                                 baseline: Sequence[float], target: int) -> tuple[float, float]:
    """One item's deletion and insertion AUC by explicit steps (ties: smaller group index first)."""
    G, d = len(groups), len(x)
    order = sorted(range(G), key=lambda g: (-scores[g], g))
    dele, ins, frac = [], [], []
    changed: set[int] = set()
    for s in range(G + 1):
        if s > 0:
            changed |= set(groups[order[s - 1]])
        xd = [baseline[j] if j in changed else x[j] for j in range(d)]
        xi = [x[j] if j in changed else baseline[j] for j in range(d)]
        dele.append(proba(xd)[target])
        ins.append(proba(xi)[target])
        frac.append(len(changed) / d)
    trap = lambda ys: sum((frac[i + 1] - frac[i]) * (ys[i] + ys[i + 1]) / 2 for i in range(G))  # noqa: E731
    return trap(dele), trap(ins)


def surrogate_loss_and_grad(W: Sequence[Sequence[float]], b: Sequence[float], Z: Sequence[Sequence[float]],
                            P: Sequence[Sequence[float]]) -> tuple[float, list[list[float]], list[float]]:
    """Mean soft-label cross-entropy of softmax(W z + b) and its gradient in W and b (no L1 term)."""
    n, C, d = len(Z), len(W), len(Z[0])
    loss, gW, gb = 0.0, [[0.0] * d for _ in range(C)], [0.0] * C
    for i in range(n):
        logits = [sum(W[c][j] * Z[i][j] for j in range(d)) + b[c] for c in range(C)]
        mx = max(logits)
        e = [math.exp(v - mx) for v in logits]
        s = sum(e)
        q = [v / s for v in e]
        loss -= sum(P[i][c] * math.log(q[c]) for c in range(C)) / n
        for c in range(C):
            r = (q[c] - P[i][c]) / n
            gb[c] += r
            for j in range(d):
                gW[c][j] += r * Z[i][j]
    return loss, gW, gb
