"""A tuned constant bracketed: a grid search that extends its grid past an edge choice (issue #53 item 1).

A choice on the edge of its grid (its smallest or largest value) says nothing about where the optimum lies.
:func:`tune_bracketed` scores an increasing grid of positive values (learning rates, regularisation strengths),
chooses by :func:`~icml26.common.tuning.select` (the highest score, ties to the smaller value), and while the choice
sits on an edge, at most ``extend`` times, scores one more value past that edge (the grid's first ratio) and chooses
again. The record says whether the final choice is still on an edge, so a result can flag it.

Example:
    >>> rec, art = tune_bracketed((1e-3, 3e-3, 9e-3), lambda v: (-abs(v - 1e-4), v), extend=2)
    >>> [round(v, 6) for v in rec["grid"]], round(rec["chosen"], 6), rec["at_edge"]
    ([0.000111, 0.000333, 0.001, 0.003, 0.009], 0.000111, True)
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

from .tuning import Rule, select

__all__ = ["tune_bracketed"]


def tune_bracketed(
    grid: Sequence[float], score: Callable[[float], tuple[float, Any]], extend: int
) -> tuple[dict[str, Any], Any]:
    """Choose a value of ``grid`` (increasing, positive) by ``score(value) -> (validation score, artifact)``: the
    highest score, ties to the smaller value. While the choice is on an edge of the grid, and at most ``extend``
    times, one more value past that edge (``grid[1] / grid[0]`` times beyond it) is scored and the choice made again.

    Args:
        grid: at least two increasing positive values.
        score: trains and scores one value on VALIDATION data; the artifact is what it trained.
        extend: how many values may be added past the edges (0: the grid as given).
    Returns:
        ``({"grid", "scores", "chosen", "at_edge"}, the chosen value's artifact)``; ``at_edge`` is the final
        choice's (still on an edge after the extensions).
    Raises:
        ValueError: a grid of fewer than two values, not increasing or not positive; ``extend`` negative; a NaN
            score.
    """
    values = [float(v) for v in grid]
    if len(values) < 2:
        raise ValueError(f"grid needs at least two values, got {list(grid)!r}")
    if any(not (math.isfinite(v) and v > 0) for v in values) or any(b <= a for a, b in itertools.pairwise(values)):
        raise ValueError(f"grid must hold increasing positive values, got {list(grid)!r}")
    if isinstance(extend, bool) or not isinstance(extend, int) or extend < 0:
        raise ValueError(f"extend must be a non-negative int, got {extend!r}")
    got = [score(v) for v in values]
    scores, arts = [float(g[0]) for g in got], [g[1] for g in got]
    ratio = values[1] / values[0]
    rule = Rule(maximize=True, ties="first")        # the grid is kept increasing: ties go to the smaller value
    for k in range(extend + 1):
        chosen, at_edge = select(values, scores, rule)
        if not at_edge or k == extend:
            break
        # on an edge: one more value past it
        low = values.index(chosen) == 0
        value = chosen / ratio if low else chosen * ratio
        s, art = score(value)
        at = 0 if low else len(values)
        values.insert(at, value)
        scores.insert(at, float(s))
        arts.insert(at, art)
    return {"grid": values, "scores": scores, "chosen": chosen, "at_edge": at_edge}, arts[values.index(chosen)]
