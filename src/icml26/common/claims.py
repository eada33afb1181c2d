"""The check language of the paper cards: when does a claim hold, computed from measured values.

A card's claim carries a ``check`` string such as::

    gcpa.recall_at_1 - mcca.recall_at_1 >= 0.02 on >= 2 of 3 seeds
    shampoo_graft.steps_to_target / adamw.steps_to_target < 1.0 on mean
    fedit.type1_error <= 0.1 on all seeds

Grammar (whitespace-separated; no code is ever evaluated)::

    check  := expr OP NUMBER [ "on" scope ]
    expr   := ref | ref "-" ref | ref "/" ref          # absolute, difference, ratio
    ref    := ARM "." METRIC                           # names: letters, digits, "_"
    OP     := ">=" | "<=" | ">" | "<"
    scope  := "mean"                                   # the check on the mean over seeds (default)
            | "all seeds"                              # the check on every seed
            | ">=" K "of" N "seeds"                    # on at least ceil(K/N * n_seeds) seeds

In a difference or ratio the left ref is the method, the right one the baseline. Per-seed values are paired
by seed index. A NaN anywhere makes the claim not hold, with the reason.

Example:
    >>> c = parse_check("a.acc - b.acc >= 0.05 on >= 2 of 3 seeds")
    >>> arms = {"a": {"acc": {"values": [0.9, 0.8, 0.7]}}, "b": {"acc": {"values": [0.8, 0.8, 0.6]}}}
    >>> outcome = c.evaluate(arms)
    >>> outcome.holds, outcome.passed, outcome.needed
    (True, 2, 2)
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_REF = rf"(?P<{{g}}arm>{_NAME})\.(?P<{{g}}metric>{_NAME})"
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_CHECK_RE = re.compile(
    r"^\s*" + _REF.format(g="l") + r"\s*(?:(?P<combine>[-/])\s*" + _REF.format(g="r") + r")?"
    r"\s*(?P<op>>=|<=|>|<)\s*(?P<threshold>" + _NUMBER + r")"
    r"(?:\s+on\s+(?P<scope>mean|all\s+seeds|>=\s*(?P<k>\d+)\s+of\s+(?P<n>\d+)\s+seeds))?\s*$"
)
_OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}


class CheckSyntaxError(ValueError):
    """A card's ``check`` string does not follow the grammar in this module's docstring."""


@dataclass(frozen=True)
class Ref:
    """One measured quantity: ``arm.metric``."""

    arm: str
    metric: str

    def __str__(self) -> str:
        return f"{self.arm}.{self.metric}"


@dataclass(frozen=True)
class Outcome:
    """The result of evaluating a check over seeds."""

    holds: bool
    """whether the claim holds under its check"""
    passed: int
    """seeds (or 1 for ``mean``) on which the comparison held"""
    needed: int
    """seeds needed for the claim to hold"""
    evaluated: int
    """seeds evaluated (1 for ``mean``)"""
    value: float
    """the compared quantity on the mean over seeds (difference, ratio or the value itself)"""
    why: str
    """one sentence saying what was compared and how it came out"""


@dataclass(frozen=True)
class Check:
    """A parsed check; ``evaluate(arms)`` decides whether the claim holds."""

    text: str
    method: Ref
    baseline: Ref | None
    combine: str | None  # "-" or "/" or None
    op: str
    threshold: float
    scope: str  # "mean" | "all" | "k_of_n"
    k: int = 0
    n: int = 0

    @property
    def refs(self) -> tuple[Ref, ...]:
        return (self.method,) if self.baseline is None else (self.method, self.baseline)

    def _quantity(self, a: float, b: float | None) -> float:
        if self.combine is None:
            return a
        assert b is not None
        if self.combine == "-":
            return a - b
        if b == 0.0:
            return math.inf if a > 0 else (-math.inf if a < 0 else math.nan)
        return a / b

    def needed_seeds(self, n_seeds: int) -> int:
        """How many of ``n_seeds`` seeds must pass."""
        if self.scope == "mean":
            return 1
        if self.scope == "all":
            return n_seeds
        return max(1, math.ceil(self.k / self.n * n_seeds - 1e-9))

    def evaluate(self, arms: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> Outcome:
        """Evaluate on ``arms`` (``{arm: {metric: {"values": [...], ...}}}``, as in a result JSON).

        Raises:
            KeyError: an arm or metric the check names was not measured (a card/experiment mismatch).
            ValueError: the method and baseline were measured on different numbers of seeds.
        """
        series: list[list[float]] = []
        for ref in self.refs:
            if ref.arm not in arms:
                raise KeyError(f"check {self.text!r}: arm {ref.arm!r} was not measured (arms: {sorted(arms)})")
            if ref.metric not in arms[ref.arm]:
                raise KeyError(
                    f"check {self.text!r}: metric {ref.metric!r} of arm {ref.arm!r} was not measured "
                    f"(metrics: {sorted(arms[ref.arm])})"
                )
            series.append([float(v) for v in arms[ref.arm][ref.metric]["values"]])
        n_seeds = len(series[0])
        if any(len(s) != n_seeds for s in series) or n_seeds == 0:
            raise ValueError(f"check {self.text!r}: refs have different or zero numbers of seeds")
        nan_refs = [str(r) for r, s in zip(self.refs, series, strict=True) if any(math.isnan(v) for v in s)]
        means = [sum(s) / len(s) for s in series]
        mean_q = self._quantity(means[0], means[1] if len(means) > 1 else None)
        cmp = _OPS[self.op]
        desc = self._describe_quantity()
        if nan_refs:
            return Outcome(False, 0, self.needed_seeds(n_seeds), n_seeds, mean_q,
                           f"does not hold: {', '.join(nan_refs)} has NaN values")
        if self.scope == "mean":
            ok = bool(cmp(mean_q, self.threshold))
            why = (f"{desc} = {_fmt(mean_q)} on the mean over {n_seeds} seed(s); "
                   f"needs {self.op} {_fmt(self.threshold)}")
            return Outcome(ok, int(ok), 1, 1, mean_q, why)
        per_seed = [
            self._quantity(series[0][i], series[1][i] if len(series) > 1 else None) for i in range(n_seeds)
        ]
        passed = sum(bool(cmp(q, self.threshold)) for q in per_seed)
        needed = self.needed_seeds(n_seeds)
        ok = passed >= needed
        why = (f"{desc} {self.op} {_fmt(self.threshold)} on {passed} of {n_seeds} seed(s), needs {needed} "
               f"(per seed: {', '.join(_fmt(q) for q in per_seed)})")
        return Outcome(ok, passed, needed, n_seeds, mean_q, why)

    def _describe_quantity(self) -> str:
        if self.baseline is None:
            return str(self.method)
        return f"{self.method} {self.combine} {self.baseline}"


def _fmt(x: float) -> str:
    if math.isnan(x) or math.isinf(x):
        return str(x)
    if x != 0 and (abs(x) >= 1e4 or abs(x) < 1e-3):
        return f"{x:.3g}"
    return f"{x:.4g}"


def parse_check(text: str) -> Check:
    """Parse a card's ``check`` string (grammar in the module docstring).

    Raises:
        TypeError: ``text`` is not a string.
        CheckSyntaxError: it does not follow the grammar, or K > N.
    """
    if not isinstance(text, str):
        raise TypeError(f"check must be a string, got {type(text).__name__}")
    m = _CHECK_RE.match(text)
    if m is None:
        raise CheckSyntaxError(
            f"check {text!r} does not parse; expected e.g. "
            "'method.metric - baseline.metric >= 0.05 on >= 2 of 3 seeds'"
        )
    method = Ref(m["larm"], m["lmetric"])
    baseline = Ref(m["rarm"], m["rmetric"]) if m["combine"] else None
    scope_text = m["scope"]
    k = n = 0
    if scope_text is None or scope_text == "mean":
        scope = "mean"
    elif scope_text.startswith("all"):
        scope = "all"
    else:
        scope, k, n = "k_of_n", int(m["k"]), int(m["n"])
        if n == 0 or k == 0 or k > n:
            raise CheckSyntaxError(f"check {text!r}: need 1 <= K <= N in '>= K of N seeds'")
    return Check(text=text.strip(), method=method, baseline=baseline, combine=m["combine"], op=m["op"],
                 threshold=float(m["threshold"]), scope=scope, k=k, n=n)


def describe_stat(stat: Mapping[str, Any], digits: int = 3) -> str:
    """``"0.812 ± 0.014"`` from a ``{"mean", "std", "values"}`` entry (no ± for a single seed)."""
    mean, std, values = float(stat["mean"]), float(stat["std"]), list(stat.get("values", []))
    if len(values) <= 1:
        return _sig(mean, digits)
    return f"{_sig(mean, digits)} ± {_sig(std, digits)}"


def _sig(x: float, digits: int) -> str:
    if math.isnan(x) or math.isinf(x):
        return str(x)
    if float(x).is_integer() and abs(x) < 1e15:
        return str(int(x))
    if abs(x) >= 1000:
        return f"{x:.1f}"
    return f"{x:.{digits}g}"


def summarize_refs(check: Check, arms: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> tuple[str, str | None]:
    """``(method, baseline)`` as ``"arm.metric = mean ± std"`` strings (baseline ``None`` for absolute checks)."""
    def one(ref: Ref) -> str:
        return f"{ref} = {describe_stat(arms[ref.arm][ref.metric])}"

    return one(check.method), (one(check.baseline) if check.baseline is not None else None)


def ours_text(check: Check, arms: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    """One line for a result's ``ours`` field: the refs' mean ± std and, for two refs, the compared quantity."""
    method, baseline = summarize_refs(check, arms)
    if baseline is None:
        return method
    outcome_value = check.evaluate(arms).value
    word = "difference" if check.combine == "-" else "ratio"
    return f"{method} vs {baseline} ({word} {_fmt(outcome_value)})"


def is_number_list(values: Sequence[Any]) -> bool:
    """True if ``values`` is a list of real numbers (bools excluded)."""
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
