"""Literal float64 transcriptions of the routing equations, and a route-forcing path independent of the hooks.

``masked_route`` computes r' = r + Phi, p = softmax(r'), top-k, optional renormalisation with explicit loops.
``patched_router`` replaces a router's ``forward`` (the way the official UnsafeMoE code patches its gates) so
RoSais / F-SOUR numbers can be recomputed without :class:`~icml26.unsafe_moe.routing.RouterController` (tests).

Example:
    >>> w, idx = masked_route([[2.0, 1.0, 0.0, -1.0]], [[False, True, False, False]], top_k=2, renormalize=True)
    >>> idx, [round(v, 6) for v in w[0]]
    ([[0, 2]], [0.880797, 0.119203])
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch


def masked_route(
    logits: Sequence[Sequence[float]], mask: Sequence[Sequence[bool]] | None, *, top_k: int, renormalize: bool
) -> tuple[list[list[float]], list[list[int]]]:
    """Per token: r' = r + Phi (Phi = -inf where ``mask``), p = softmax(r'), the top-k by p, optionally / sum."""
    weights, indices = [], []
    for n, row in enumerate(logits):
        r = [float(v) + (-math.inf if mask is not None and mask[n][e] else 0.0) for e, v in enumerate(row)]
        top = max(r)
        z = sum(math.exp(v - top) for v in r)
        p = [math.exp(v - top) / z for v in r]
        order = sorted(range(len(p)), key=lambda e: (-p[e], e))[:top_k]
        w = [p[e] for e in order]
        if renormalize:
            s = sum(w)
            w = [v / s for v in w]
        weights.append(w)
        indices.append(order)
    return weights, indices


@contextlib.contextmanager
def patched_router(module: Any, keep: Sequence[int], *, top_k: int, renormalize: bool) -> Iterator[None]:
    """Temporarily make ``module`` (a ``*TopKRouter``) route every token only through ``keep``."""
    original = module.forward
    weight = module.weight

    def forward(hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = hidden_states.reshape(-1, weight.shape[1])
        logits = torch.nn.functional.linear(h, weight)
        phi = [[e not in keep for e in range(weight.shape[0])] for _ in range(h.shape[0])]
        w, idx = masked_route(logits.double().tolist(), phi, top_k=top_k, renormalize=renormalize)
        return (
            logits.masked_fill(torch.tensor(phi), -math.inf),
            torch.tensor(w, dtype=logits.dtype),
            torch.tensor(idx),
        )

    module.forward = forward
    try:
        yield
    finally:
        module.forward = original


@contextlib.contextmanager
def patched_routes(
    modules: dict[int, Any], routes: dict[tuple[int, int], Sequence[int]], *, top_k: int, renormalize: bool
) -> Iterator[None]:
    """Temporarily force token ``t`` at layer ``l`` onto ``routes[(t, l)]`` for every full-sequence call of a
    batch-1 model (``modules``: ``{layer: router}``); other tokens keep the router's own choice."""
    originals = {}
    for layer, module in modules.items():
        forced = {t: list(e) for (t, lay), e in routes.items() if lay == layer}
        weight = module.weight

        def forward(
            hidden_states: torch.Tensor, _w: torch.Tensor = weight, _forced: dict[int, list[int]] = forced
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            h = hidden_states.reshape(-1, _w.shape[1])
            logits = torch.nn.functional.linear(h, _w)
            phi = [
                [t in _forced and e not in _forced[t] for e in range(_w.shape[0])] for t in range(h.shape[0])
            ]
            w, idx = masked_route(logits.double().tolist(), phi, top_k=top_k, renormalize=renormalize)
            return (
                logits.masked_fill(torch.tensor(phi), -math.inf),
                torch.tensor(w, dtype=logits.dtype),
                torch.tensor(idx),
            )

        originals[layer] = module.forward
        module.forward = forward
    try:
        yield
    finally:
        for layer, module in modules.items():
            module.forward = originals[layer]
