"""Per-arm tuning on validation data: one grid per arm, one selection rule, one record of the choice.

Several experiments pick each arm's learning rate (or another knob) from a grid by a score on validation data
(never the test items). :func:`tune_per_arm` runs that loop once for all of them:

- ``grids``: ``{arm: [value, ...]}``, tried in the given order (arm by arm, value by value, draw by draw);
- ``evaluate(arm, value, draw)``: trains and scores one (arm, value, validation draw) on VALIDATION data and
  returns the score, or ``(score, artifact)`` to keep what was trained (the chosen value's artifact, from its
  first draw, is returned; the others are dropped as soon as they lose, so at most two are held per arm);
- ``rule``: :class:`Rule`, the best mean score over ``draws >= 1`` validation draws, higher or lower is better,
  ties to the first or last value of the grid.

It returns a :class:`Tuning`: ``chosen`` (``{arm: value}``), ``kept`` (``{arm: artifact}``) and ``record``
(``{arm: {"grid", "scores", "chosen", "rule", "at_edge"}}``), which experiments put into their result. A choice
on the edge of its grid (its smallest or largest value, for a grid of two or more) is flagged ``at_edge``: a
tuned constant needs a grid value on each side of the choice before the optimum can be said to lie inside.

Example:
    >>> t = tune_per_arm({"a": [0.1, 0.3, 1.0]}, lambda arm, lr, draw: -abs(lr - 0.3))
    >>> t.chosen["a"], t.record["a"]["at_edge"], t.record["a"]["rule"]
    (0.3, False, 'best mean of 1 validation draw(s), higher is better, ties to the first grid value')
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Rule", "Tuning", "select", "tune_per_arm"]


@dataclass(frozen=True)
class Rule:
    """How a grid value is chosen from its validation scores."""

    draws: int = 1
    """validation draws per (arm, value); the score of a value is the mean over its draws"""
    maximize: bool = True
    """higher scores are better (else lower)"""
    ties: str = "first"
    """``"first"`` or ``"last"``: which grid value (in the grid's order) wins among equal mean scores"""

    def __post_init__(self) -> None:
        if not isinstance(self.draws, int) or isinstance(self.draws, bool) or self.draws < 1:
            raise ValueError(f"draws must be an integer >= 1, got {self.draws!r}")
        if self.ties not in ("first", "last"):
            raise ValueError(f"ties must be 'first' or 'last', got {self.ties!r}")

    def describe(self) -> str:
        """The rule in words (stored in the record)."""
        return (f"best mean of {self.draws} validation draw(s), {'higher' if self.maximize else 'lower'} is better, "
                f"ties to the {self.ties} grid value")

    def better(self, new: float, old: float) -> bool:
        """Does a value scoring ``new``, later in the grid, replace the current choice scoring ``old``?"""
        if new == old:
            return self.ties == "last"
        return new > old if self.maximize else new < old


@dataclass
class Tuning:
    """What :func:`tune_per_arm` chose."""

    chosen: dict[str, Any] = field(default_factory=dict)
    """``{arm: chosen grid value}``"""
    kept: dict[str, Any] = field(default_factory=dict)
    """``{arm: artifact of the chosen value's first draw}`` (``None`` where ``evaluate`` returns a bare score)"""
    record: dict[str, dict[str, Any]] = field(default_factory=dict)
    """``{arm: {"grid": [...], "scores": [mean per value], "chosen": value, "rule": text, "at_edge": bool}}``"""

    def at_edge(self) -> list[str]:
        """The arms whose choice sits on an edge of their grid."""
        return [arm for arm, r in self.record.items() if r["at_edge"]]


def _check_grid(name: str, grid: Sequence[Any]) -> list[Any]:
    values = list(grid)
    if not values:
        raise ValueError(f"{name} is empty; it needs at least one value")
    for i, v in enumerate(values):
        if any(v == w for w in values[:i]):
            raise ValueError(f"{name} repeats the value {v!r}")
    return values


def select(grid: Sequence[Any], scores: Sequence[float], rule: Rule | None = None) -> tuple[Any, bool]:
    """``(chosen value, at_edge)`` of ``grid`` under ``rule`` given one mean score per value.

    Raises:
        ValueError: ``grid`` is empty, or ``scores`` does not hold one finite-or-inf number per grid value.
    """
    rule = rule or Rule()
    values = _check_grid("grid", grid)
    if len(scores) != len(values):
        raise ValueError(f"scores must hold one score per grid value ({len(values)}), got {len(scores)}")
    if any(math.isnan(float(s)) for s in scores):
        raise ValueError(f"scores must not be NaN, got {list(scores)}")
    best = 0
    for i in range(1, len(values)):
        if rule.better(float(scores[i]), float(scores[best])):
            best = i
    return values[best], len(values) > 1 and best in (0, len(values) - 1)


def tune_per_arm(
    grids: Mapping[str, Sequence[Any]],
    evaluate: Callable[[str, Any, int], float | tuple[float, Any]],
    rule: Rule | None = None,
) -> Tuning:
    """Choose one value per arm from its grid by ``evaluate`` on validation data under ``rule``.

    ``evaluate(arm, value, draw)`` is called for every arm (in ``grids``' order), every value (in grid order) and
    every draw ``0 .. rule.draws - 1``, in that nesting, once each; nothing else is trained.

    Raises:
        ValueError: ``grids`` is empty, an arm's grid is empty or repeats a value, or a score is NaN (naming
            the argument).
    """
    rule = rule or Rule()
    if not grids:
        raise ValueError("grids must name at least one arm")
    checked = {arm: _check_grid(f"grids[{arm!r}]", grid) for arm, grid in grids.items()}
    out = Tuning()
    for arm, values in checked.items():
        means: list[float] = []
        best_i, best_artifact = -1, None
        for i, value in enumerate(values):
            scores, artifact = [], None
            for draw in range(rule.draws):
                got = evaluate(arm, value, draw)
                score, art = got if isinstance(got, tuple) else (got, None)
                score = float(score)
                if math.isnan(score):
                    raise ValueError(f"evaluate returned a NaN score for arm {arm!r}, value {value!r}, draw {draw}")
                scores.append(score)
                if draw == 0:
                    artifact = art
            # the mean in draw order (one draw: the score itself, bit for bit)
            mean = scores[0] if len(scores) == 1 else math.fsum(scores) / len(scores)
            means.append(mean)
            if best_i < 0 or rule.better(mean, means[best_i]):
                best_i, best_artifact = i, artifact
            del artifact
        out.chosen[arm] = values[best_i]
        out.kept[arm] = best_artifact
        out.record[arm] = {
            "grid": values,
            "scores": means,
            "chosen": values[best_i],
            "rule": rule.describe(),
            "at_edge": len(values) > 1 and best_i in (0, len(values) - 1),
        }
    return out
