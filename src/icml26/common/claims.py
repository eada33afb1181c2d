"""The check language of the paper cards: three verdicts (holds / inconclusive / fails) from confidence bounds.

A card's claim carries a ``check`` string such as::

    repo.accuracy - rpo.accuracy >= 0.03 over prompts        # paired difference over test items
    shampoo.steps / adamw.steps <= 0.9 over seeds            # paired log-ratio over seeds
    fedit.reject <= 0.07 over replications                   # a rate: Clopper-Pearson on 0/1 outcomes
    |ps_ppo.accuracy - grpo.accuracy| <= 0.05 over prompts   # equivalence (TOST)
    sb_xfirst.tree_size / sb_zfirst.tree_size >= 10 exactly  # deterministic arms: one value, no interval

Grammar (whitespace-separated; no code is ever evaluated)::

    check   := expr OP NUMBER pairing [ "by" PROCEDURE ]
    expr    := ref | ref "-" ref | ref "/" ref | "|" ref "-" ref "|"
    ref     := ARM "." METRIC                          # names: letters, digits, "_"
    OP      := ">=" | "<=" | ">" | "<"                 # "|a - b|" takes "<=" or "<" only
    pairing := "over seeds"                            # one paired value per seed
             | "over" UNIT [ "in retrained runs" ]    # per-unit values the experiment recorded (prompts, ...)
             | "exactly"                               # deterministic arms: every seed gave the same value
    PROCEDURE := "t" | "bootstrap" | "binomial"

In a difference or ratio the left ref is the method, the right one the baseline. Values are paired by seed
and, ``over UNIT``, by unit index within a seed.

**Units nested in runs (verdicts v3 to v5).** A seed is a training run: its units share the run's randomness, so
they are not independent of each other. Before any interval,

1. units with the same id within a seed (the result's ``unit_ids``) are one unit: their mean;
2. seeds whose ids and values are identical for every ref are one run (a deterministic arm gives the same
   units on every seed; they are counted once, never pooled as copies). A check written ``over UNIT in
   retrained runs`` declares that every arm it names is trained afresh on each seed: identical seeds are then
   separate runs that came out alike (an attack that succeeds on every prompt in most runs), not copies of one
   computation, and are kept. The declaration needs evidence in the result: each arm of the check must have a
   metric (wall-clock ``*_s`` metrics aside) that differs between seeds; without it the seeds are counted once
   and the test says why. (Added after verdicts v5 with no change to the rules of checks without the clause:
   collapsing a saturated retrained arm left spard's full precondition on two "runs" out of 25, a t with under
   two degrees of freedom, where its three-seed quick run decided it. The evidence test cannot tell an arm
   retrained per seed from a fixed model evaluated on per-seed data; the card's declaration and its history are
   the record.)
3. with one distinct run left, the interval is the unit-level one below, *within that run*; with ``G >= 2``
   runs it is the t interval over the ``G`` run means (``G - 1`` degrees of freedom: the run is the cluster).
   When the runs share units (the same ids in several runs: a fixed test set, models retrained per seed) the
   variance of the mean over the shared units is added to the run-means variance and the degrees of freedom
   are Welch-Satterthwaite's. For 0/1 outcomes the bounds are also no narrower than the exact ones below on
   the *effective* number of distinct units, ``min(n_distinct, n_total / deff)`` with ``deff`` the interval's
   variance over that of the ``n_total`` pooled units (the counts scaled to it; Korn and Graubard 1998,
   without their degrees-of-freedom factor, which at three runs is three times stricter than the t itself).
   (Verdicts v5: v4 took ``n_distinct / deff``, which counts the sharing twice when runs share their units,
   since ``deff`` already carries it: 60 shared prompts in 25 runs became 3.6 effective units, and a fixed
   test set's power at 25 x 60 fell to 0 where v5 has 0.47 at 0.15 with its level kept, simulated in
   ``tests/test_claims_v3.py``. Designs without shared units decide as under v4.)
4. (verdicts v4) For a rate against a threshold ``p0`` (one ref, 0/1 outcomes), the variance of the run
   means is scaled to the rate at the threshold, ``V * max(1, p0 (1 - p0) / (p (1 - p)))``, never narrower:
   a run's binomial noise follows its rate, so runs that come out low also come out tight, and the t over a
   few run means is liberal (the score interval's reason for evaluating the variance at the null).

Verdicts v3 had neither step 4 nor the design effect in step 3; simulated at the boundary with normal
seed-level spread of rates, it said "holds" up to 10.5 % of the time at a threshold of 0.05 (3 x 60 units,
spread 0.3 unit sd) and 6.0 % at 0.2; v4 keeps rates at or below 4.1 % at every simulated design. **Known limit**:
when the seeds' rates are strongly skewed (Beta-distributed, spread 0.2-0.3 unit sd; a rate near 0 that
some seeds push far up), no interval over three to five runs keeps its level without a model of that
distribution: v4 measures 6-13 % there (v3: 9-22 %); ``tests/test_claims_v3.py`` lists the cells.

``over seeds`` is already one value per run (paired t over seeds); when every seed gives the same value for
every ref it is one deterministic result, decided exactly. The level of these rules at the project's designs
(3x48, 3x60, 5x60, 3x600 units; seed-level spread 0-0.3 of the unit sd; 0/1 and continuous; nested and
shared units) is simulated in ``tests/test_claims_v3.py`` ("holds" at the boundary <= 6 %).

The unit-level interval (one run) comes from

- ``t``: the paired t interval (default for real-valued data);
- ``binomial`` (default for per-unit data whose every value is 0 or 1): the exact Clopper–Pearson bounds for
  one ref (a rate, e.g. a type-I error), and for a difference of paired 0/1 outcomes the Agresti–Min interval
  for matched proportions (the Wald interval on the 2x2 table with 0.5 added to each cell), which keeps close
  to its level with few or no discordant pairs, where McNemar's conditional interval collapses to a point;
- ``bootstrap``: the paired bootstrap, resampling units (10,000 draws, fixed RNG seed 0, percentile bounds).

The compared quantity is the mean of the paired quantities (differences; log-ratios for a ratio, shown back
on the ratio scale as a geometric-mean ratio; the values themselves for one ref); ``[lo, hi]`` are its
one-sided 95 % lower and upper bounds (together a two-sided 90 % interval). Each outcome records its design:
the distinct runs (``clusters``), the distinct units and the design effect (the interval's variance over the
variance that pooled independent units would give).

A result records the rules that decided it (``rules``); ``evaluate(rules=3)`` re-decides a result written
under verdicts v3.

**The verdict.** For ``>=``/``>``: *holds* when ``lo`` clears the threshold, *fails* when ``hi`` is below it,
*inconclusive* otherwise (``<=``/``<`` mirrored). For ``|a - b| <= X`` (two one-sided tests): *holds* when
``[lo, hi]`` lies within ``[-X, X]``, *fails* when it lies wholly outside, *inconclusive* otherwise. ``exactly``
compares the single value. A NaN or infinite value, fewer than two paired units, or a ratio of non-positive
values makes the claim *inconclusive*, with the reason.

Example:
    >>> c = parse_check("a.acc - b.acc >= 0.05 over seeds")
    >>> arms = {"a": {"acc": {"values": [0.9, 0.85, 0.88]}}, "b": {"acc": {"values": [0.7, 0.72, 0.69]}}}
    >>> out = c.evaluate(arms)
    >>> out.verdict, round(out.estimate, 4), out.test
    ('holds', 0.1733, 'paired t over seeds')
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: one-sided confidence level of each bound
CONFIDENCE = 0.95
#: paired bootstrap draws and its fixed RNG seed (so a verdict recomputes exactly)
BOOTSTRAP_DRAWS = 10_000
BOOTSTRAP_SEED = 0

#: the decision rules this module applies (results record it); 3 = the exact floor on distinct units only, 4 = on
#: distinct units over the design effect; both kept to verify results written under them
RULES = 5
SUPPORTED_RULES = (3, 4, 5)
VERDICTS = ("holds", "inconclusive", "fails")
CLAIM_KINDS = ("evidence", "precondition", "sanity")
PROCEDURES = ("t", "bootstrap", "binomial")

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_REF = rf"(?P<{{g}}arm>{_NAME})\.(?P<{{g}}metric>{_NAME})"
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_CHECK_RE = re.compile(
    r"^\s*(?P<abs>\|)?\s*" + _REF.format(g="l") + r"\s*(?:(?P<combine>[-/])\s*" + _REF.format(g="r") + r")?"
    r"\s*(?P<abs2>\|)?\s*(?P<op>>=|<=|>|<)\s*(?P<threshold>" + _NUMBER + r")"
    r"\s+(?:(?P<exactly>exactly)|over\s+(?P<unit>" + _NAME + r")(?P<retrained>\s+in\s+retrained\s+runs)?)"
    r"(?:\s+by\s+(?P<procedure>" + _NAME + r"))?\s*$"
)


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
    """The decision on one claim."""

    verdict: str
    """``holds``, ``inconclusive`` or ``fails``"""
    estimate: float
    """the compared quantity (mean difference, geometric-mean ratio or mean value)"""
    interval: tuple[float, float]
    """its one-sided 95 % lower and upper bounds (NaN where no interval could be formed)"""
    test: str
    """the procedure that gave the interval"""
    units: str
    """what was paired, and how many"""
    n: int
    """number of paired units (seeds for ``over seeds``)"""
    per_seed: tuple[float, ...]
    """the compared quantity on each seed alone"""
    why: str
    """one sentence: the quantity, its bounds, the threshold and the verdict"""
    design: Mapping[str, Any] | None = None
    """verdicts v3: ``{"clusters", "distinct_units", "design_effect", "within_duplicates"}`` (None under v2)"""

    @property
    def holds(self) -> bool:
        return self.verdict == "holds"

    def as_dict(self) -> dict[str, Any]:
        """The fields a result JSON stores for a claim."""
        out = {"verdict": self.verdict, "holds": self.holds, "estimate": self.estimate,
               "interval": list(self.interval), "test": self.test, "units": self.units,
               "per_seed": list(self.per_seed), "why": self.why}
        if self.design is not None:
            out["design"] = dict(self.design)
        return out


@dataclass(frozen=True)
class Check:
    """A parsed check; ``evaluate(arms)`` decides the claim."""

    text: str
    method: Ref
    baseline: Ref | None
    combine: str | None  # "-", "/" or None
    equivalence: bool    # "|a - b| <= X"
    op: str
    threshold: float
    pairing: str         # "seeds", a unit name, or "exactly"
    procedure: str | None = None
    retrained: bool = False  # "over UNIT in retrained runs": identical seeds are outcomes, not copies

    @property
    def refs(self) -> tuple[Ref, ...]:
        return (self.method,) if self.baseline is None else (self.method, self.baseline)

    @property
    def comparative(self) -> bool:
        """A difference, ratio or equivalence between two arms."""
        return self.baseline is not None

    @property
    def deterministic(self) -> bool:
        return self.pairing == "exactly"

    @property
    def quantity_name(self) -> str:
        if self.baseline is None:
            return str(self.method)
        if self.equivalence:
            return f"|{self.method} - {self.baseline}|"
        return f"{self.method} {self.combine} {self.baseline}"

    @property
    def word(self) -> str:
        """What the estimate is: value, difference or ratio."""
        return "value" if self.combine is None else ("ratio" if self.combine == "/" else "difference")

    # -- data -------------------------------------------------------------------------------------------
    def _series(self, arms: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> list[list[list[float]]]:
        """``[ref][seed][unit]`` values; ``over seeds``/``exactly`` give one unit per seed."""
        out: list[list[list[float]]] = []
        unit_names = set()
        for ref in self.refs:
            if ref.arm not in arms:
                raise KeyError(f"check {self.text!r}: arm {ref.arm!r} was not measured (arms: {sorted(arms)})")
            if ref.metric not in arms[ref.arm]:
                raise KeyError(f"check {self.text!r}: metric {ref.metric!r} of arm {ref.arm!r} was not measured "
                               f"(metrics: {sorted(arms[ref.arm])})")
            stat = arms[ref.arm][ref.metric]
            if self.pairing in ("seeds", "exactly"):
                out.append([[float(v)] for v in stat["values"]])
                continue
            if stat.get("unit") != self.pairing or "unit_values" not in stat:
                raise ValueError(f"check {self.text!r}: {ref} has no per-unit values over {self.pairing!r} "
                                 f"(recorded unit: {stat.get('unit')!r}); the experiment must record them "
                                 "(SeedRun.units)")
            unit_names.add(stat["unit"])
            out.append([[float(v) for v in seed] for seed in stat["unit_values"]])
        n_seeds = len(out[0])
        if n_seeds == 0 or any(len(s) != n_seeds for s in out):
            raise ValueError(f"check {self.text!r}: refs have different or zero numbers of seeds")
        if len(out) == 2:
            for i, (a, b) in enumerate(zip(out[0], out[1], strict=True)):
                if len(a) != len(b):
                    raise ValueError(f"check {self.text!r}: seed #{i} has {len(a)} units of {self.method} but "
                                     f"{len(b)} of {self.baseline}; paired units must match")
        return out

    # -- decision ---------------------------------------------------------------------------------------
    def evaluate(self, arms: Mapping[str, Mapping[str, Mapping[str, Any]]],
                 unit_ids: Mapping[str, Sequence[Sequence[str]]] | None = None, *, rules: int = RULES) -> Outcome:
        """Decide the claim on ``arms`` (``{arm: {metric: {"values", ["unit", "unit_values"]}}}``, as stored).

        Args:
            arms: the result's ``arms``.
            unit_ids: the result's ``unit_ids`` (``{unit: [[id per unit] per seed]}``); without ids the units of
                different seeds are taken as distinct and those within a seed as distinct.
            rules: ``5`` (this module's rules), ``4`` (the exact floor of 0/1 outcomes on the distinct units over
                the design effect, twice the sharing of shared units) or ``3`` (on the distinct units, not their
                effective number); 3 and 4 are kept to verify results written under them.

        Raises:
            KeyError: an arm or metric the check names was not measured (a card/experiment mismatch).
            ValueError: seeds or paired units do not match, per-unit values or ids are missing or misshapen, or
                an ``exactly`` check sees values that differ between seeds.
        """
        if rules not in SUPPORTED_RULES:
            raise ValueError(f"rules must be one of {SUPPORTED_RULES}, got {rules!r}")
        return _evaluate_v3(self, arms, unit_ids, rules)

    def _paired(self, a: np.ndarray, b: np.ndarray | None) -> np.ndarray:
        """The compared quantity per paired unit: the values, their differences or their log-ratios."""
        if self.combine is None:
            return np.asarray(a, dtype=float)
        if self.combine == "/":
            # paired log-ratio: the check compares the geometric-mean ratio with the threshold
            return np.log(np.asarray(a, dtype=float) / np.asarray(b, dtype=float))
        return np.asarray(a, dtype=float) - np.asarray(b, dtype=float)

    def _pair(self, series: list[list[list[float]]], seed: int) -> np.ndarray:
        """The paired quantity per unit of one seed."""
        return self._paired(np.asarray(series[0][seed]), np.asarray(series[1][seed]) if self.combine else None)

    def _pair_runs(self, runs: list[_Run]) -> list[np.ndarray]:
        """The paired quantity per unit of each distinct run."""
        return [self._paired(r.values[0], r.values[1] if self.combine else None) for r in runs]

    def _back(self, x: float) -> float:
        return math.exp(x) if self.combine == "/" and math.isfinite(x) else x

    @property
    def _scale_threshold(self) -> float:
        return math.log(self.threshold) if self.combine == "/" else self.threshold

    def _verdict(self, lo: float, hi: float) -> str:
        t = self._scale_threshold
        if self.equivalence:
            strict = self.op == "<"
            inside = (lo > -t and hi < t) if strict else (lo >= -t and hi <= t)
            outside = (lo >= t or hi <= -t) if strict else (lo > t or hi < -t)
            return "holds" if inside else ("fails" if outside else "inconclusive")
        if self.op in (">=", ">"):
            ok = lo > t if self.op == ">" else lo >= t
            no = hi <= t if self.op == ">" else hi < t
        else:
            ok = hi < t if self.op == "<" else hi <= t
            no = lo >= t if self.op == "<" else lo > t
        return "holds" if ok else ("fails" if no else "inconclusive")

    def _rule(self) -> str:
        if self.equivalence:
            return f"holds if both bounds lie within ±{_fmt(self.threshold)}"
        side = "lower" if self.op in (">=", ">") else "upper"
        return f"holds if the {side} bound is {self.op} {_fmt(self.threshold)}"

    def _exactly(self, series: list[list[list[float]]], units_desc: str) -> Outcome:
        values = []
        for ref, s in zip(self.refs, series, strict=True):
            flat = {v for seed in s for v in seed}
            if len(flat) != 1:
                raise ValueError(f"check {self.text!r} is 'exactly' but {ref} differs between seeds: {sorted(flat)}")
            values.append(flat.pop())
        if self.combine == "/" and values[1] == 0.0:
            return self._inconclusive("the ratio's baseline is 0", units_desc, series)
        if self.combine is None:
            q = values[0]
        elif self.combine == "/":
            q = values[0] / values[1]
        else:
            q = values[0] - values[1]
        scaled = math.log(q) if self.combine == "/" and q > 0 else (-math.inf if self.combine == "/" else q)
        verdict = self._verdict(scaled, scaled)
        why = f"{self.quantity_name} = {_fmt(q)} (deterministic); {self._rule()}: {verdict}"
        return Outcome(verdict, q, (q, q), "exact: deterministic arms", units_desc, 1, (q,), why)

    def _inconclusive(self, reason: str, units_desc: str, series: list[list[list[float]]]) -> Outcome:
        nan = math.nan
        return Outcome("inconclusive", nan, (nan, nan), "none", units_desc,
                       sum(len(seed) for seed in series[0]), tuple(nan for _ in series[0]),
                       f"inconclusive: {reason}")

    def _units_desc(self, series: list[list[list[float]]]) -> str:
        n_seeds = len(series[0])
        if self.deterministic:
            return f"deterministic, {n_seeds} run(s)"
        if self.pairing == "seeds":
            return f"{n_seeds} seed(s)" + (", paired" if self.comparative else "")
        sizes = [len(s) for s in series[0]]
        per = f"{sizes[0]} per seed" if len(set(sizes)) == 1 else "/".join(map(str, sizes)) + " per seed"
        return (f"{sum(sizes)} {self.pairing} ({per} x {n_seeds} seed(s))"
                + (", paired" if self.comparative else ""))


# -- verdicts v3: units nested in (or crossed with) runs ----------------------------------------------------
@dataclass(frozen=True)
class _Run:
    """One distinct run (a seed, or several seeds that gave identical units): per-ref values per distinct unit."""

    ids: tuple[str, ...]
    values: tuple[np.ndarray, ...]


def _unit_ids_for(check: Check, series: list[list[list[float]]],
                  unit_ids: Mapping[str, Sequence[Sequence[Any]]] | None) -> list[list[str]] | None:
    """The ids of the check's units: those of its refs' metrics (``"arm.metric"``, which must agree between
    paired refs), else those of its unit name, else ``None``."""
    if not unit_ids:
        return None
    own = [unit_ids[str(r)] for r in check.refs if str(r) in unit_ids]
    if any(o != own[0] for o in own):
        raise ValueError(f"check {check.text!r}: its paired refs carry different unit ids")
    if own:
        ids = own[0]
    elif check.pairing in unit_ids:
        ids = unit_ids[check.pairing]
    else:
        return None
    if len(ids) != len(series[0]):
        raise ValueError(f"check {check.text!r}: unit ids of {check.pairing!r} cover {len(ids)} seed(s), the "
                         f"values {len(series[0])}")
    out = []
    for i, (seed_ids, seed_values) in enumerate(zip(ids, series[0], strict=True)):
        if len(seed_ids) != len(seed_values):
            raise ValueError(f"check {check.text!r}: seed #{i} has {len(seed_values)} {check.pairing} but "
                             f"{len(seed_ids)} unit ids")
        out.append([str(u) for u in seed_ids])
    return out


def _distinct_runs(series: list[list[list[float]]], ids: list[list[str]] | None,
                   keep_identical: bool = False) -> tuple[list[_Run], int, int]:
    """Merge units with the same id within a seed (their mean is the unit), then keep one copy of runs whose
    ids and values are identical (every run with ``keep_identical``: retrained runs that came out alike).
    Returns the runs, the number of merged duplicate units and the number of identical seeds kept."""
    runs: list[_Run] = []
    seen: set[tuple[Any, ...]] = set()
    merged = kept = 0
    for g in range(len(series[0])):
        seed_ids = ids[g] if ids is not None else [f"#{g}:{i}" for i in range(len(series[0][g]))]
        order = list(dict.fromkeys(seed_ids))
        merged += len(seed_ids) - len(order)
        values = []
        for s in series:
            if len(order) == len(seed_ids):
                values.append(np.asarray(s[g], dtype=float))
                continue
            sums: dict[str, list[float]] = {}
            for uid, v in zip(seed_ids, s[g], strict=True):
                sums.setdefault(uid, []).append(v)
            values.append(np.array([math.fsum(sums[u]) / len(sums[u]) for u in order]))
        key = (tuple(order), *(tuple(v.tolist()) for v in values)) if ids is not None else (
            "anonymous", *(tuple(v.tolist()) for v in values))
        # without ids, constant values (all 0, all 1) repeat by chance in fresh draws: only ids can say they
        # are the same units; non-constant vectors that repeat exactly are copies
        constant = all(len(set(v.tolist())) <= 1 for v in values)
        if key in seen and (ids is not None or not constant):
            if not keep_identical:
                continue
            kept += 1
        seen.add(key)
        runs.append(_Run(tuple(order), tuple(values)))
    return runs, merged, kept


def _unvarying_arms(check: Check, arms: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> list[str]:
    """The arms of a ``retrained`` check with no metric (wall-clock ``*_s`` aside) that differs between seeds:
    no evidence that the seed changes them."""
    out = []
    for arm in dict.fromkeys(r.arm for r in check.refs):
        varies = False
        for name, stat in arms[arm].items():
            if name.endswith("_s") or not isinstance(stat, Mapping):
                continue
            per_seed = stat.get("unit_values", stat.get("values"))
            if isinstance(per_seed, list) and len(per_seed) > 1 and any(
                    not _same_values(v, per_seed[0]) for v in per_seed[1:]):
                varies = True
                break
        if not varies:
            out.append(arm)
    return out


def _same_values(a: Any, b: Any) -> bool:
    """Whether two seeds' records of a metric are equal (NaN equal to NaN; non-numbers by ``==``)."""
    try:
        x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    except (TypeError, ValueError):
        return a == b
    return x.shape == y.shape and bool(np.array_equal(x, y, equal_nan=True))


def _keep_identical(check: Check, arms: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> tuple[bool, str]:
    """Whether identical seeds stay separate runs (``in retrained runs`` with evidence), and a note for the test."""
    if not check.retrained:
        return False, ""
    still = _unvarying_arms(check, arms)
    if still:
        return False, (f"; declared retrained, but no metric of {', '.join(still)} differs between seeds: "
                       "identical seeds counted once")
    return True, ""


def _evaluate_v3(check: Check, arms: Mapping[str, Mapping[str, Mapping[str, Any]]],
                 unit_ids: Mapping[str, Sequence[Sequence[Any]]] | None, rules: int = RULES) -> Outcome:
    series = check._series(arms)
    n_seeds = len(series[0])
    desc = check._units_desc(series)
    bad = [str(r) for r, s in zip(check.refs, series, strict=True)
           if any(not math.isfinite(v) for seed in s for v in seed)]
    if bad:
        return _with_design(check._inconclusive(f"{', '.join(bad)} has NaN or infinite values", desc, series),
                            n_seeds, None, None, 0)
    if check.deterministic:
        return _with_design(check._exactly(series, desc), 1, 1, None, 0)
    if check.combine == "/" and any(v <= 0 for s in series for seed in s for v in seed):
        return _with_design(check._inconclusive("a ratio needs positive values on both sides", desc, series),
                            n_seeds, None, None, 0)
    per_seed = tuple(check._back(float(np.mean(check._pair(series, i)))) for i in range(n_seeds))
    if check.pairing == "seeds":
        if check.procedure == "binomial":
            raise ValueError(f"check {check.text!r}: 'by binomial' needs 0/1 outcomes per unit, not per-seed values")
        if n_seeds >= 2 and all(len({seed[0] for seed in s}) == 1 for s in series):
            out = check._exactly(series, desc)
            test = f"exact: deterministic arms (identical on all {n_seeds} seeds: one result)"
            return _with_design(dataclasses.replace(out, test=test, why=out.why.replace(
                "(deterministic)", f"(identical on all {n_seeds} seeds: one deterministic result)")), 1, 1, None, 0)
        x = np.array([check._pair(series, g)[0] for g in range(n_seeds)])
        if n_seeds < 2:
            return _with_design(check._inconclusive("one paired unit (one seed) gives no interval", desc, series), 1, 1, None, 0)
        lo, hi = _t_bounds(x)
        test = "paired t over seeds" if check.comparative else "t over seeds"
        return _finish(check, float(x.mean()), lo, hi, test, desc, n_seeds, per_seed,
                       {"clusters": n_seeds, "distinct_units": n_seeds, "design_effect": 1.0,
                        "within_duplicates": 0})
    ids = _unit_ids_for(check, series, unit_ids)
    keep, keep_note = _keep_identical(check, arms)
    runs, merged, kept = _distinct_runs(series, ids, keep)
    binary = all(set(np.unique(v).tolist()) <= {0.0, 1.0} for r in runs for v in r.values)
    procedure = check.procedure or ("binomial" if binary and check.combine != "/" else "t")
    if procedure == "binomial" and not binary:
        raise ValueError(f"check {check.text!r}: 'by binomial' needs 0/1 outcomes")
    if procedure == "binomial" and check.combine == "/":
        raise ValueError(f"check {check.text!r}: 'by binomial' does not apply to a ratio")
    paired = check._pair_runs(runs)
    n_total = int(sum(len(d) for d in paired))
    distinct = len({u for r in runs for u in r.ids}) if ids is not None else n_total
    crossed = ids is not None and distinct < n_total
    desc = _v3_desc(check, series, runs, distinct, merged, ids is not None, crossed, kept > 0)
    g = len(runs)
    if n_total < 2:
        return _with_design(check._inconclusive("one paired unit gives no interval", desc, series),
                            g, distinct, None, merged)
    pooled = np.concatenate(paired)
    naive = float(pooled.var(ddof=1)) / n_total if n_total > 1 else math.nan
    if g == 1:
        groups = [paired[0]]
        one = [[list(v)] for v in runs[0].values]
        est, lo, hi, test = _interval(groups, procedure, one if procedure == "binomial" else None,
                                      paired=check.comparative)
        test += (f"; {n_seeds} seeds gave identical units: counted once" if n_seeds > 1
                 else "; within one run (seed-to-seed variance not measured)")
        design_variance = naive
    else:
        means = np.array([d.mean() for d in paired])
        est = float(means.mean())
        between = float(means.var(ddof=1)) / g
        df = float(g - 1)
        if crossed:
            # units shared by the runs: their sampling variance is not in the spread of the run means
            by_id: dict[str, list[float]] = {}
            for r, d in zip(runs, paired, strict=True):
                for u, v in zip(r.ids, d, strict=True):
                    by_id.setdefault(u, []).append(float(v))
            u_means = np.array([math.fsum(v) / len(v) for v in by_id.values()])
            shared = float(u_means.var(ddof=1)) / len(u_means) if len(u_means) > 1 else 0.0
            variance = between + shared
            if variance > 0:  # Welch-Satterthwaite degrees of freedom of the sum
                df = variance**2 / (between**2 / (g - 1) + shared**2 / max(len(u_means) - 1, 1))
            how = f"{df:.3g} df (Satterthwaite); + the sampling variance of the units the runs share"
        else:
            variance = between
            how = f"{g - 1} df"
            if between == 0.0:  # identical run means: no narrower than the units' own sampling variance
                variance = sum(float(d.var(ddof=1)) / len(d) for d in paired if len(d) > 1) / g**2
                how += "; run means identical, floored at the within-run sampling variance"
        design_variance, score = variance, ""
        if (rules >= 4 and procedure == "binomial" and not check.comparative and not check.equivalence
                and 0.0 < check.threshold < 1.0 and 0.0 < est < 1.0):
            # a rate's run means have a binomial part whose variance follows the rate: a run mean below a
            # threshold under 0.5 comes with a smaller variance, and the t over a few run means is liberal.
            # Scale the variance to the rate at the threshold (the score interval's idea; never narrower):
            # $$\hat V_0 = \hat V \max(1, p_0 (1 - p_0) / (\bar p (1 - \bar p)))$$
            inflate = max(1.0, check.threshold * (1 - check.threshold) / (est * (1 - est)))
            if inflate > 1.0:
                variance *= inflate
                score = f"; variance scaled x{inflate:.3g} to the rate at the threshold"
        from scipy import stats

        half = float(stats.t.ppf(CONFIDENCE, df)) * math.sqrt(variance)
        lo, hi = est - half, est + half
        test = f"t over {g} run means ({how}{score})"
        if procedure == "binomial":
            # effective distinct units (Korn and Graubard 1998): the deff is the design's variance over that of
            # n_total pooled units, so $$n_{eff} = \min(n_{distinct}, n_{total} / \mathrm{deff})$$ (v5); v4 divided
            # n_distinct by it, counting the sharing twice when runs share units; v3: n_distinct
            deff_floor = max(1.0, design_variance / naive) if rules >= 4 and naive > 0 else 1.0
            if rules >= 5:  # the same floor as a design effect on the distinct units
                deff_floor = max(1.0, deff_floor * distinct / n_total)
            elo, ehi, label = _exact_distinct(runs, distinct / n_total, check.comparative, deff_floor)
            lo, hi = min(lo, elo), max(hi, ehi)
            test += f"; no narrower than {label}"
    test += keep_note
    if procedure == "binomial":  # a t interval can leave the outcomes' range
        floor = -1.0 if check.comparative else 0.0
        lo, hi = min(max(lo, floor), 1.0), min(max(hi, floor), 1.0)
    deff = design_variance / naive if naive and math.isfinite(naive) and naive > 0 else None
    return _finish(check, est, lo, hi, test, desc, distinct, per_seed,
                   {"clusters": g, "distinct_units": distinct,
                    "design_effect": None if deff is None else round(deff, 6), "within_duplicates": merged})


@dataclass(frozen=True)
class Components:
    """The variance of a check's paired quantity, split as the design splits it (from one result)."""

    within: float
    """variance between units of one run (0 for a check over seeds)"""
    between: float
    """variance of the true run means around the method's mean (seed-to-seed spread, >= 0)"""
    runs: int
    units_per_run: float
    shared: bool
    """the runs share their units (a fixed test set)"""

    def standard_error(self, runs: int, units_per_run: float) -> tuple[float, float]:
        """``(SE, df)`` of the compared quantity under a design of ``runs`` x ``units_per_run``."""
        if units_per_run < 1 or runs < 1:
            raise ValueError(f"need runs >= 1 and units_per_run >= 1, got {runs}, {units_per_run}")
        if runs == 1:
            return math.sqrt(self.within / units_per_run), max(units_per_run - 1.0, 1.0)
        if self.shared:
            var = self.between / runs + self.within / units_per_run
        else:
            var = (self.between + self.within / units_per_run) / runs
        return math.sqrt(var), float(runs - 1)

    def power(self, effect: float, runs: int, units_per_run: float, level: float = CONFIDENCE) -> float:
        """Probability that the one-sided bound clears a threshold ``effect`` below the true quantity (t
        approximation, on the check's scale: log for a ratio)."""
        from scipy import stats

        se, df = self.standard_error(runs, units_per_run)
        if se == 0:
            return 1.0 if effect > 0 else 0.0
        return float(stats.nct.sf(stats.t.ppf(level, df), df, abs(effect) / se))

    def detectable(self, runs: int, units_per_run: float, power: float = 0.8, level: float = CONFIDENCE) -> float:
        """The smallest distance between the true quantity and the threshold that the design resolves with
        ``power``: ``(t_level + t_power) * SE`` with the design's degrees of freedom."""
        from scipy import stats

        se, df = self.standard_error(runs, units_per_run)
        return float((stats.t.ppf(level, df) + stats.t.ppf(power, df)) * se)


def components(check: Check, arms: Mapping[str, Mapping[str, Mapping[str, Any]]],
               unit_ids: Mapping[str, Sequence[Sequence[Any]]] | None = None) -> Components | None:
    """The variance components of ``check``'s paired quantity in a stored result (``None`` when the check is
    deterministic or has a non-finite value). With one distinct run, ``between`` is 0: not measured."""
    if check.deterministic:
        return None
    series = check._series(arms)
    if any(not math.isfinite(v) for s in series for seed in s for v in seed):
        return None
    if check.combine == "/" and any(v <= 0 for s in series for seed in s for v in seed):
        return None
    if check.pairing == "seeds":
        x = np.array([check._pair(series, g)[0] for g in range(len(series[0]))])
        return Components(0.0, float(x.var(ddof=1)) if len(x) > 1 else 0.0, len(x), 1.0, False)
    ids = _unit_ids_for(check, series, unit_ids)
    runs, _, _ = _distinct_runs(series, ids, _keep_identical(check, arms)[0])
    paired = check._pair_runs(runs)
    sizes = [len(d) for d in paired]
    within = float(np.mean([d.var(ddof=1) for d in paired if len(d) > 1])) if max(sizes) > 1 else 0.0
    m = float(np.mean(sizes))
    shared = ids is not None and len({u for r in runs for u in r.ids}) < sum(sizes)
    between = 0.0
    if len(runs) > 1:
        spread = float(np.var([d.mean() for d in paired], ddof=1))
        between = max(0.0, spread - (0.0 if shared else within / m))
    return Components(within, between, len(runs), m, shared)


def _finish(check: Check, est: float, lo: float, hi: float, test: str, desc: str, n: int,
            per_seed: tuple[float, ...], design: dict[str, Any]) -> Outcome:
    estimate, lo_b, hi_b = check._back(est), check._back(lo), check._back(hi)
    verdict = check._verdict(lo, hi)
    why = (f"{check.quantity_name} = {_fmt(estimate)} with one-sided 95 % bounds [{_fmt(lo_b)}, {_fmt(hi_b)}] "
           f"({test}, {desc}); {check._rule()}: {verdict}")
    return Outcome(verdict, estimate, (lo_b, hi_b), test, desc, n, per_seed, why, design)


def _with_design(out: Outcome, clusters: int, distinct: int | None, deff: float | None, merged: int) -> Outcome:
    return dataclasses.replace(out, design={"clusters": clusters, "distinct_units": distinct,
                                            "design_effect": deff, "within_duplicates": merged})


def _v3_desc(check: Check, series: list[list[list[float]]], runs: list[_Run], distinct: int, merged: int,
             has_ids: bool, crossed: bool, kept: bool = False) -> str:
    n_seeds = len(series[0])
    sizes = [len(s) for s in series[0]]
    per = f"{sizes[0]} per seed" if len(set(sizes)) == 1 else "/".join(map(str, sizes)) + " per seed"
    parts = [f"{distinct} distinct {check.pairing} in {len(runs)} run(s) ({per} x {n_seeds} seed(s)"]
    if len(runs) < n_seeds:
        parts.append(f"; {n_seeds - len(runs) + 1} identical seeds counted once")
    if kept:
        parts.append("; retrained runs: identical seeds kept")
    if merged:
        parts.append(f"; {merged} repeated within a seed, merged")
    if crossed:
        parts.append("; the same units in several runs")
    if not has_ids:
        parts.append("; no unit ids recorded: taken as distinct")
    return "".join(parts) + ")" + (", paired" if check.comparative else "")


def _exact_distinct(runs: list[_Run], scale: float, comparative: bool,
                    design_effect: float = 1.0) -> tuple[float, float, str]:
    """Exact bounds on the distinct units: Clopper-Pearson (a rate) or Agresti-Min (paired), the counts over
    all runs scaled to the number of distinct units (units shared by runs count once) and divided by the
    ``design_effect`` (>= 1): the effective number of distinct units. The design effect here (and in the test's
    text) is relative to the distinct units; the result's ``design["design_effect"]`` is relative to all
    ``n_total`` pooled units, so the two differ by ``n_total / n_distinct`` when runs share units."""
    from scipy import stats

    units = "distinct units" if design_effect == 1.0 else f"effective distinct units (design effect {design_effect:.3g})"
    pairs = "distinct pairs" if design_effect == 1.0 else f"effective distinct pairs (design effect {design_effect:.3g})"
    scale = scale / design_effect

    if not comparative:
        k = sum(float(r.values[0].sum()) for r in runs) * scale
        n = sum(len(r.values[0]) for r in runs) * scale
        lo = 0.0 if k <= 0 else float(stats.beta.ppf(1 - CONFIDENCE, k, n - k + 1))
        hi = 1.0 if k >= n else float(stats.beta.ppf(CONFIDENCE, k + 1, n - k))
        return lo, hi, f"Clopper-Pearson on {n:g} {units} ({k:g} of {n:g})"
    a = np.concatenate([r.values[0] for r in runs])
    b = np.concatenate([r.values[1] for r in runs])
    only_a, only_b = float(((a == 1) & (b == 0)).sum()) * scale, float(((a == 0) & (b == 1)).sum()) * scale
    conc = float((a == b).sum()) * scale
    lo, hi = _agresti_min(only_a, only_b, conc)
    return lo, hi, (f"Agresti-Min on {only_a + only_b + conc:g} {pairs} "
                    f"({only_a:g} vs {only_b:g} discordant)")


def _interval(groups: list[np.ndarray], procedure: str, series: list[list[list[float]]] | None,
              *, paired: bool) -> tuple[float, float, float, str]:
    """``(estimate, lo, hi, test)`` for the mean of the units of one run (``groups``: that run's array)."""
    x = np.concatenate(groups)
    est = float(x.mean())
    if procedure == "t":
        lo, hi = _t_bounds(x)
        return est, lo, hi, "paired t" if paired else "t"
    if procedure == "bootstrap":
        lo, hi = _bootstrap_bounds(groups)
        return est, lo, hi, (("paired " if paired else "") + f"bootstrap ({BOOTSTRAP_DRAWS} draws within seeds, "
                             "percentile)")
    assert series is not None
    if len(series) == 1:
        k, n = int(x.sum()), len(x)
        lo, hi = clopper_pearson(k, n)
        return est, lo, hi, f"Clopper-Pearson ({k} of {n})"
    a = np.concatenate([np.asarray(s) for s in series[0]])
    b = np.concatenate([np.asarray(s) for s in series[1]])
    both, only_a = int(((a == 1) & (b == 1)).sum()), int(((a == 1) & (b == 0)).sum())
    only_b, neither = int(((a == 0) & (b == 1)).sum()), int(((a == 0) & (b == 0)).sum())
    lo, hi = agresti_min_interval(only_a, only_b, both + neither)
    return est, lo, hi, f"Agresti-Min paired ({only_a} vs {only_b} discordant of {len(a)})"


def _t_bounds(x: np.ndarray) -> tuple[float, float]:
    """One-sided ``CONFIDENCE`` t bounds for the mean of ``x`` (the point itself when ``x`` has no spread)."""
    from scipy import stats

    n = len(x)
    mean = float(x.mean())
    if n < 2:
        return math.nan, math.nan
    sd = float(x.std(ddof=1))
    if sd == 0.0:
        return mean, mean
    half = float(stats.t.ppf(CONFIDENCE, n - 1)) * sd / math.sqrt(n)
    return mean - half, mean + half


def _bootstrap_bounds(groups: list[np.ndarray]) -> tuple[float, float]:
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    total = sum(len(g) for g in groups)
    sums = np.zeros(BOOTSTRAP_DRAWS)
    for g in groups:
        idx = rng.integers(0, len(g), size=(BOOTSTRAP_DRAWS, len(g)))
        sums += g[idx].sum(axis=1)
    means = sums / total
    return float(np.quantile(means, 1 - CONFIDENCE)), float(np.quantile(means, CONFIDENCE))


def clopper_pearson(k: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """One-sided Clopper–Pearson bounds ``(lo, hi)`` for a binomial proportion ``k / n``.

    ``lo = Beta_{1-c}(k, n - k + 1)`` (0 when k = 0), ``hi = Beta_c(k + 1, n - k)`` (1 when k = n).

    Example:
        >>> [round(v, 4) for v in clopper_pearson(0, 20)]
        [0.0, 0.1391]
    """
    from scipy import stats

    if not (isinstance(k, int) and isinstance(n, int)) or n < 1 or not 0 <= k <= n:
        raise ValueError(f"need integers 0 <= k <= n, n >= 1; got k={k!r}, n={n!r}")
    lo = 0.0 if k == 0 else float(stats.beta.ppf(1 - confidence, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(confidence, k + 1, n - k))
    return lo, hi


def agresti_min_interval(only_method: int, only_baseline: int, concordant: int,
                         confidence: float = CONFIDENCE) -> tuple[float, float]:
    """One-sided bounds for the difference of paired proportions ``(only_method - only_baseline) / n``.

    Agresti and Min's adjusted Wald interval: add 0.5 to each of the four cells of the 2x2 table
    (``b, c`` the discordant counts, ``n`` the pairs), then::

        d = (b* - c*) / n*,   var = ((b* + c*) - (b* - c*)² / n*) / n*²,   d ± z sqrt(var)

    It stays close to its level with few or no discordant pairs, where the conditional (McNemar) interval
    collapses to a point; bounds are clipped to [-1, 1].

    Reference: A. Agresti and Y. Min, "Simple improved confidence intervals for comparing matched
    proportions", Statistics in Medicine 24 (2005) 729–740; recommended among the simple intervals by
    M. W. Fagerland, S. Lydersen and P. Laake, Statistics in Medicine 33 (2014) 2850–2875.

    Example:
        >>> [round(v, 4) for v in agresti_min_interval(12, 2, 86)]
        [0.0377, 0.1584]
        >>> [round(v, 4) for v in agresti_min_interval(0, 0, 6)]  # all concordant: still uncertain
        [-0.2056, 0.2056]
    """
    counts = (only_method, only_baseline, concordant)
    if not all(isinstance(v, int) and v >= 0 for v in counts) or sum(counts) < 1:
        raise ValueError(f"need non-negative integer counts with a positive total, got {counts!r}")
    return _agresti_min(float(only_method), float(only_baseline), float(concordant), confidence)


def _agresti_min(only_method: float, only_baseline: float, concordant: float,
                 confidence: float = CONFIDENCE) -> tuple[float, float]:
    """``agresti_min_interval`` on real-valued counts (effective counts of distinct units)."""
    from scipy import stats

    b, c, n = only_method + 0.5, only_baseline + 0.5, only_method + only_baseline + concordant + 2.0
    d = (b - c) / n
    var = ((b + c) - (b - c) ** 2 / n) / n**2
    half = float(stats.norm.ppf(confidence)) * math.sqrt(var)
    return max(-1.0, d - half), min(1.0, d + half)


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
        CheckSyntaxError: it does not follow the grammar, uses an unknown procedure, an equivalence without
            two refs and ``<=``/``<``, or a ratio threshold that is not positive.
    """
    if not isinstance(text, str):
        raise TypeError(f"check must be a string, got {type(text).__name__}")
    m = _CHECK_RE.match(text)
    example = "e.g. 'method.acc - baseline.acc >= 0.05 over prompts'"
    if m is None:
        raise CheckSyntaxError(f"check {text!r} does not parse; expected {example}")
    equivalence = bool(m["abs"]) or bool(m["abs2"])
    if equivalence and not (m["abs"] and m["abs2"] and m["combine"] == "-"):
        raise CheckSyntaxError(f"check {text!r}: an equivalence is written '|a.x - b.x| <= margin'")
    if equivalence and m["op"] not in ("<=", "<"):
        raise CheckSyntaxError(f"check {text!r}: an equivalence takes '<=' or '<'")
    threshold = float(m["threshold"])
    if m["combine"] == "/" and threshold <= 0:
        raise CheckSyntaxError(f"check {text!r}: a ratio's threshold must be positive")
    if equivalence and threshold <= 0:
        raise CheckSyntaxError(f"check {text!r}: an equivalence margin must be positive")
    procedure = m["procedure"]
    if procedure is not None and procedure not in PROCEDURES:
        raise CheckSyntaxError(f"check {text!r}: procedure {procedure!r} is not one of {list(PROCEDURES)}")
    if m["exactly"] and procedure is not None:
        raise CheckSyntaxError(f"check {text!r}: an 'exactly' check takes no procedure")
    if m["retrained"] and m["unit"] == "seeds":
        raise CheckSyntaxError(f"check {text!r}: 'in retrained runs' applies to units within runs, not 'over seeds'")
    return Check(text=" ".join(text.split()), method=Ref(m["larm"], m["lmetric"]),
                 baseline=Ref(m["rarm"], m["rmetric"]) if m["combine"] else None, combine=m["combine"],
                 equivalence=equivalence, op=m["op"], threshold=threshold,
                 pairing="exactly" if m["exactly"] else m["unit"], procedure=procedure,
                 retrained=bool(m["retrained"]))


def describe_stat(stat: Mapping[str, Any], digits: int = 3) -> str:
    """``"0.812 ± 0.014"`` from a ``{"mean", "std", "values"}`` entry (no ± for one seed or identical seeds)."""
    mean, std, values = float(stat["mean"]), float(stat["std"]), list(stat.get("values", []))
    # by value, not by a set: NaN never equals itself, whether the NaNs are one object (as JSON reads them) or not
    if len(values) <= 1 or all(v == values[0] for v in values):
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


def describe_interval(outcome: Outcome | Mapping[str, Any], digits: int = 3) -> str:
    """``"0.45 [0.41, 0.49]"``: the estimate and its bounds (``"0.45 (exact)"`` for deterministic arms)."""
    if isinstance(outcome, Outcome):
        est, (lo, hi), test = outcome.estimate, outcome.interval, outcome.test
    else:
        est, (lo, hi), test = outcome["estimate"], outcome["interval"], outcome["test"]
    if test.startswith("exact: deterministic"):
        return f"{_sig(est, digits)} (exact)"
    if any(isinstance(v, float) and math.isnan(v) for v in (est, lo, hi)):
        return "—"
    return f"{_sig(est, digits)} [{_sig(lo, digits)}, {_sig(hi, digits)}]"


def summarize_refs(check: Check, arms: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> tuple[str, str | None]:
    """``(method, baseline)`` as ``"arm.metric = mean ± std"`` strings (baseline ``None`` for absolute checks)."""
    def one(ref: Ref) -> str:
        return f"{ref} = {describe_stat(arms[ref.arm][ref.metric])}"

    return one(check.method), (one(check.baseline) if check.baseline is not None else None)


def ours_text(check: Check, arms: Mapping[str, Mapping[str, Mapping[str, Any]]],
              outcome: Outcome | None = None) -> str:
    """One line for a result's ``ours`` field: the refs' mean ± std and the compared quantity with its bounds."""
    outcome = check.evaluate(arms) if outcome is None else outcome
    method, baseline = summarize_refs(check, arms)
    if baseline is None:
        return f"{method}; {check.word} {describe_interval(outcome)}"
    return f"{method} vs {baseline}; {check.word} {describe_interval(outcome)}"


def is_number_list(values: Sequence[Any]) -> bool:
    """True if ``values`` is a list of real numbers (bools excluded)."""
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
