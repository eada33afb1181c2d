"""Verdicts v3: units nested in runs, distinct units, and the level of the rules at the project's designs.

The level simulation draws data at the boundary of a check (the true compared quantity equals the threshold)
with a seed-level spread of the effect, decides it with the real ``Check.evaluate`` and counts "holds"; at the
boundary a 95 % one-sided bound should say "holds" at most 5 % of the time. The test asks <= 6 %; the fast
tier runs fewer draws and allows its Monte Carlo error (two standard errors of a 5 % rate) on top. Rates are
drawn at thresholds 0.2 and 0.05 with normal seed-level spread (clipped to [0, 1]) and, separately, with
Beta-distributed (skewed) seed-level rates, whose known limit is stated below.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from scipy import stats

from icml26.common.claims import CheckSyntaxError, clopper_pearson, components, parse_check

#: the project's designs (runs x units per run) and the seed-level spread of the effect, in unit sds
DESIGNS = ((3, 48), (3, 60), (5, 60), (3, 600))
SPREADS = (0.0, 0.05, 0.1, 0.2, 0.3)
KINDS = ("continuous", "rate", "rate05", "paired01", "shared", "shared01", "shared_rate")


def arms(unit="units", **series):
    out: dict = {}
    for key, values in series.items():
        arm, metric = key.split("__")
        per_seed = [float(np.mean(v)) for v in values]
        out.setdefault(arm, {})[metric] = {"values": per_seed, "unit": unit,
                                           "unit_values": [[float(x) for x in v] for v in values]}
    return out


def draw(kind: str, g: int, m: int, spread: float, rng: np.random.Generator, effect: float = 0.0):
    """One data set at the boundary (``effect`` = 0) of the kind's check; returns (check, arms, unit_ids)."""
    if kind.startswith("rate"):  # a rate against its threshold, e.g. a false-positive rate <= 0.2 (or 0.05)
        p0 = 0.05 if kind.endswith("05") else 0.2
        mu, sd = p0 - effect, spread * math.sqrt(p0 * (1 - p0))
        if kind.startswith("rate_beta"):  # the seed-level rates Beta-distributed (skewed) instead of normal
            k = mu * (1 - mu) / sd**2 - 1 if sd > 0 else math.inf
            ps = rng.beta(mu * k, (1 - mu) * k, g) if sd > 0 else np.full(g, mu)
        else:
            ps = np.clip(mu + sd * rng.standard_normal(g), 0, 1)
        return (parse_check(f"a.x <= {p0} over units"),
                arms(a__x=[(rng.random(m) < p).astype(float) for p in ps]), None)
    if kind == "paired01":  # a paired difference of 0/1 outcomes, e.g. accuracy of two arms on one prompt
        a, b = [], []
        for _ in range(g):
            shift = spread * 0.5 * rng.standard_normal() + effect
            a.append((rng.random(m) < 0.5 + shift / 2).astype(float))
            b.append((rng.random(m) < 0.5 - shift / 2).astype(float))
        return parse_check("a.x - b.x >= 0 over units"), arms(a__x=a, b__x=b), None
    if kind in ("shared01", "shared_rate"):  # 0/1 outcomes on a fixed test set, the models retrained per seed
        ids = {"units": [[f"u{i}" for i in range(m)]] * g}
        if kind == "shared01":  # each item its own rate and its own effect (mean 0 over the item population)
            q, e = rng.uniform(0.2, 0.8, m), 0.3 * rng.standard_normal(m)
            a, b = [], []
            for _ in range(g):
                d = spread * 0.5 * rng.standard_normal() + effect
                a.append((rng.random(m) < np.clip(q + (e + d) / 2, 0, 1)).astype(float))
                b.append((rng.random(m) < np.clip(q - (e + d) / 2, 0, 1)).astype(float))
            return parse_check("a.x - b.x >= 0 over units"), arms(a__x=a, b__x=b), ids
        p0 = 0.2  # items' rates Beta around the rate (mean p0 - effect), a seed-level shift on top
        mu = p0 - effect
        q = rng.beta(4 * mu, 4 * (1 - mu), m)
        runs = [(rng.random(m) < np.clip(q + spread * math.sqrt(p0 * (1 - p0)) * rng.standard_normal(), 0, 1))
                .astype(float) for _ in range(g)]
        return parse_check(f"a.x <= {p0} over units"), arms(a__x=runs), ids
    shared = kind == "shared"  # the same test units in every run (a fixed test set, models retrained per seed)
    item = rng.standard_normal(m)
    a = [rng.standard_normal(m) + spread * rng.standard_normal() + effect + (item if shared else 0.0)
         for _ in range(g)]
    ids = {"units": [[f"u{i}" for i in range(m)]] * g} if shared else None
    return parse_check("a.x - b.x >= 0 over units"), arms(a__x=a, b__x=[np.zeros(m)] * g), ids


def holds_rate(kind: str, g: int, m: int, spread: float, reps: int, seed: int = 0, effect: float = 0.0) -> float:
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(reps):
        check, data, ids = draw(kind, g, m, spread, rng, effect)
        hits += check.evaluate(data, unit_ids=ids).verdict == "holds"
    return hits / reps


def _mc_allowance(reps: int) -> float:
    return 2 * math.sqrt(0.05 * 0.95 / reps)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("design", [(3, 48), (3, 600)])
def test_level_at_the_boundary_fast(kind, design):
    reps = 500
    worst = max(holds_rate(kind, *design, spread, reps, seed=11) for spread in (0.0, 0.1, 0.3))
    assert worst <= 0.06 + _mc_allowance(reps), (kind, design, worst)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("design", DESIGNS)
def test_level_at_the_boundary(kind, design):
    """<= 6 % at every spread, 4,000 draws each (Monte Carlo standard error 0.34 % at a true 5 %)."""
    reps = 4000
    rates = {spread: holds_rate(kind, *design, spread, reps, seed=3) for spread in SPREADS}
    assert max(rates.values()) <= 0.06, (kind, design, rates)


#: Seed-level rates drawn from a Beta (skewed: rates near 0 vary mostly upwards) instead of a normal. Up to a
#: spread of 0.05 unit sd the level holds at every design (and up to 0.1 at all but one); beyond it the t over
#: three to five run means is liberal, and no interval over so few runs can repair that without a model of the
#: seeds' distribution.
#: Measured under verdicts v4 (4,000 draws each, "holds" at the boundary in %), the cells beyond the bar:
#: threshold 0.2: 3x60 6.7 (spread 0.3), 5x60 6.1 (0.3), 3x600 6.9 (0.3); threshold 0.05: 3x48 6.7 (0.3),
#: 3x60 7.1 (0.3), 5x60 6.8 / 11.4 (0.2 / 0.3), 3x600 6.1 / 8.2 / 12.8 (0.1 / 0.2 / 0.3). Stated in
#: ``common/claims.py`` as the rules' known limit; v3 (no score scaling) gave 9-22 % there.
BETA_SPREADS = (0.0, 0.05)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ("rate_beta", "rate_beta05"))
@pytest.mark.parametrize("design", DESIGNS)
def test_level_with_skewed_seed_rates(kind, design):
    reps = 4000
    rates = {spread: holds_rate(kind, *design, spread, reps, seed=3) for spread in BETA_SPREADS}
    assert max(rates.values()) <= 0.06, (kind, design, rates)


def test_shared_units_are_not_counted_twice_in_the_exact_floor():
    """v5: 25 runs on the same 60 items with an effect of 0.15 (spard's full design): the exact floor on
    min(n_distinct, n_total / deff) effective units leaves the t's power; v4's n_distinct / deff (3.6 units at
    spard's design effect) had none."""
    assert holds_rate("shared01", 25, 60, 0.1, 150, seed=7, effect=0.15) >= 0.3
    rng = np.random.default_rng(7)
    v4 = sum(parse_check("a.x - b.x >= 0 over units").evaluate(data, unit_ids=ids, rules=4).verdict == "holds"
             for _check, data, ids in (draw("shared01", 25, 60, 0.1, rng, 0.15) for _ in range(40)))
    assert v4 == 0


def test_effective_units_by_hand():
    """The floor's effective units: min(n_distinct, n_total / deff); deff = the interval's variance over the
    pooled units' variance / n_total (v5), shown in the test's text; v4 divided n_distinct by that deff."""
    rng = np.random.default_rng(2)
    q = rng.uniform(0.1, 0.9, 40)
    runs = [(rng.random(40) < q).astype(float) for _ in range(6)]
    data, ids = arms(a__x=runs), {"units": [[f"u{i}" for i in range(40)]] * 6}
    out5 = parse_check("a.x >= 0.3 over units").evaluate(data, unit_ids=ids, rules=5)
    out4 = parse_check("a.x >= 0.3 over units").evaluate(data, unit_ids=ids, rules=4)
    x = np.concatenate(runs)
    deff = out5.design["design_effect"]
    assert deff == pytest.approx(out4.design["design_effect"])
    n_eff = min(40.0, 240.0 / max(deff, 1.0))
    k = x.sum() * n_eff / 240.0
    assert f"Clopper-Pearson on {n_eff:g} " in out5.test and f"({k:g} of {n_eff:g})" in out5.test
    assert f"Clopper-Pearson on {40.0 / max(deff, 1.0):g} " in out4.test
    # runs that differ much more than their binomial noise: n_total / deff falls below the 40 distinct units
    shifts = (-0.35, 0.3, -0.2, 0.35, 0.0, -0.3)
    runs = [(rng.random(40) < np.clip(q + s, 0, 1)).astype(float) for s in shifts]
    out5 = parse_check("a.x >= 0.3 over units").evaluate(arms(a__x=runs), unit_ids=ids, rules=5)
    deff = out5.design["design_effect"]
    assert 240.0 / deff < 40.0
    found = re.search(r"Clopper-Pearson on ([\d.]+) effective distinct units \(design effect ([\d.]+)\)", out5.test)
    assert found is not None, out5.test
    assert float(found.group(1)) == pytest.approx(240.0 / deff, rel=1e-4)  # min(40, 240 / deff)
    assert float(found.group(2)) == pytest.approx(deff * 40 / 240, rel=1e-2)  # the deff on the distinct units


@pytest.mark.slow
def test_power_at_full_designs():
    """Power to say "holds" at an effect of 0.4 unit sd (continuous) or 0.15 (0/1 paired), no seed spread."""
    assert holds_rate("continuous", 5, 60, 0.0, 1000, seed=5, effect=0.4) >= 0.8
    assert holds_rate("paired01", 3, 600, 0.0, 1000, seed=5, effect=0.15) >= 0.8


# -- distinct units ------------------------------------------------------------------------------------------
def test_identical_seeds_are_one_run():
    """AIR's case: the same 48 incidents on every seed are 48 units, not 5 x 48."""
    rng = np.random.default_rng(0)
    units = (rng.random(48) < 0.9).astype(float)
    k = int(units.sum())
    out = parse_check("air.detected >= 0.8 over incidents").evaluate(arms("incidents", air__detected=[units] * 5))
    assert out.interval == pytest.approx(clopper_pearson(k, 48))
    assert out.design["clusters"] == 1 and out.design["distinct_units"] == 48 and out.n == 48
    assert "5 seeds gave identical units: counted once" in out.test
    # a deterministic metric over seeds is decided exactly, without a t interval around copies
    det = parse_check("m.x - b.x >= 0.2 over seeds").evaluate(
        {"m": {"x": {"values": [0.2524] * 5}}, "b": {"x": {"values": [0.0] * 5}}})
    assert det.test.startswith("exact: deterministic arms") and det.interval == (det.estimate, det.estimate)


def test_ids_merge_duplicates_within_a_seed_and_are_checked():
    c = parse_check("m.x - b.x >= 0.0 over prompts")
    data = arms("prompts", m__x=[[1.0, 3.0, 5.0]], b__x=[[0.0, 0.0, 1.0]])
    out = c.evaluate(data, unit_ids={"prompts": [["p", "p", "q"]]})
    # p: (1 + 3) / 2 - 0 = 2; q: 5 - 1 = 4 -> two distinct units
    assert out.estimate == pytest.approx(3.0) and out.design["within_duplicates"] == 1
    assert out.design["distinct_units"] == 2
    with pytest.raises(ValueError, match="unit ids"):
        c.evaluate(data, unit_ids={"prompts": [["p", "q"]]})
    with pytest.raises(ValueError, match="seed"):
        c.evaluate(data, unit_ids={"prompts": [["p", "q", "r"], ["p", "q", "r"]]})


def test_runs_are_clusters_t_over_run_means():
    rng = np.random.default_rng(4)
    seeds = [rng.normal(mu, 0.5, 80) for mu in (0.3, 0.1, 0.25)]
    out = parse_check("m.x >= 0.05 over items").evaluate(arms("items", m__x=seeds))
    means = np.array([s.mean() for s in seeds])
    lo, hi = stats.ttest_1samp(means, 0.0).confidence_interval(confidence_level=0.90)
    assert out.interval == pytest.approx((lo, hi)) and out.test == "t over 3 run means (2 df)"
    assert out.design["clusters"] == 3 and out.design["distinct_units"] == 240
    naive = np.concatenate(seeds).var(ddof=1) / 240
    assert out.design["design_effect"] == pytest.approx(means.var(ddof=1) / 3 / naive, rel=1e-5)


def test_shared_units_add_their_sampling_variance():
    rng = np.random.default_rng(5)
    item = rng.normal(0, 1, 50)
    seeds = [item + rng.normal(0, 0.1, 50) + 0.2 for _ in range(3)]
    ids = {"items": [[f"i{j}" for j in range(50)]] * 3}
    out = parse_check("m.x >= 0.0 over items").evaluate(arms("items", m__x=seeds), unit_ids=ids)
    means = np.array([s.mean() for s in seeds])
    per_item = np.mean(seeds, axis=0)
    between, shared = means.var(ddof=1) / 3, per_item.var(ddof=1) / 50
    v = between + shared
    df = v**2 / (between**2 / 2 + shared**2 / 49)
    half = stats.t.ppf(0.95, df) * math.sqrt(v)
    assert out.interval == pytest.approx((means.mean() - half, means.mean() + half))
    assert out.design["distinct_units"] == 50 and "units the runs share" in out.test
    # without ids the same numbers would look like 150 independent precise units: far narrower
    naive = parse_check("m.x >= 0.0 over items").evaluate(arms("items", m__x=seeds))
    assert naive.interval[1] - naive.interval[0] < 0.5 * (out.interval[1] - out.interval[0])


def test_binary_runs_no_narrower_than_exact_on_distinct_units():
    runs = [np.zeros(48) for _ in range(3)]
    runs[0][0] = runs[1][1] = runs[2][2] = 1.0  # three distinct runs, 1 event each: the run means agree exactly
    out = parse_check("m.fp <= 0.05 over incidents").evaluate(arms("incidents", m__fp=runs))
    lo, hi = clopper_pearson(3, 144)
    assert out.interval[1] >= hi and out.interval[0] <= lo and "floored" in out.test
    assert "Clopper-Pearson on 141.986 effective distinct units (design effect 1.01)" in out.test
    # two seeds that gave the very same units are one run: 96 distinct units, not 144
    same = parse_check("m.fp <= 0.05 over incidents").evaluate(arms("incidents", m__fp=[runs[0], runs[0], runs[1]]))
    assert same.design == {"clusters": 2, "distinct_units": 96, "design_effect": same.design["design_effect"],
                           "within_duplicates": 0}


def test_exact_floor_on_effective_units_v4_and_v3_kept():
    """Without shared units v5 and v4 floor 0/1 bounds with Clopper-Pearson on the distinct units over the design
    effect; ``rules=3`` (distinct units only) still re-decides results written under it; other rules are
    refused."""
    rng = np.random.default_rng(6)
    # three runs whose rates differ well beyond their binomial noise: design effect > 1
    runs = [(rng.random(48) < p).astype(float) for p in (0.05, 0.30, 0.12)]
    data = arms("incidents", m__fp=runs)
    check = parse_check("m.fp <= 0.2 over incidents")
    v4, v3 = check.evaluate(data, rules=4), check.evaluate(data, rules=3)
    assert check.evaluate(data) == v4  # no shared units: v5 decides as v4
    k, n = int(sum(r.sum() for r in runs)), 144
    deff = v4.design["design_effect"]
    assert deff > 1 and v4.design == v3.design
    lo4, hi4 = stats.beta.ppf(0.05, k / deff, (n - k) / deff + 1), stats.beta.ppf(0.95, k / deff + 1, (n - k) / deff)
    assert v4.interval[1] >= hi4 - 1e-12 and v4.interval[0] <= lo4 + 1e-12
    assert v3.interval[1] <= v4.interval[1] and f"effective distinct units (design effect {deff:.3g})" in v4.test
    assert "Clopper-Pearson on 144 distinct units" in v3.test
    for bad in (2, 6):
        with pytest.raises(ValueError, match="rules"):
            check.evaluate(data, rules=bad)


def test_ids_per_metric_take_precedence_and_must_agree_between_paired_refs():
    data = arms("items", m__x=[[1.0, 0.0, 1.0]], b__x=[[0.0, 0.0, 1.0]], m__y=[[1.0, 1.0]])
    ids = {"items": [["i0", "i1"]], "m.x": [["a", "a", "b"]], "b.x": [["a", "a", "b"]]}
    out = parse_check("m.x - b.x >= 0.0 over items").evaluate(data, unit_ids=ids)
    assert out.design["distinct_units"] == 2 and out.design["within_duplicates"] == 1
    one = parse_check("m.y >= 0.5 over items").evaluate(data, unit_ids=ids)
    assert one.design["distinct_units"] == 2
    with pytest.raises(ValueError, match="different unit ids"):
        parse_check("m.x - b.x >= 0.0 over items").evaluate(data, unit_ids={**ids, "b.x": [["a", "c", "b"]]})


def test_constant_runs_without_ids_are_not_merged():
    """Fresh draws that all come out 1 are not copies; only ids could say they are the same units."""
    ones = [np.ones(60)] * 3
    out = parse_check("m.ok >= 0.9 over points").evaluate(arms("points", m__ok=ones))
    assert out.design["clusters"] == 3 and out.design["distinct_units"] == 180
    same = parse_check("m.ok >= 0.9 over points").evaluate(arms("points", m__ok=ones),
                                                           unit_ids={"points": [[f"p{i}" for i in range(60)]] * 3})
    assert same.design["clusters"] == 1 and same.design["distinct_units"] == 60


# -- retrained runs ------------------------------------------------------------------------------------------
def _saturated(n_seeds=25, n_units=60):
    """spard's full precondition: plain SFT's attack succeeds on every test prompt in all runs but one."""
    runs = [np.ones(n_units) for _ in range(n_seeds)]
    runs[7][:3] = 0.0
    data = arms("prompts", sft__asr=runs)
    # each run is retrained: its utility on the seed's own test additions differs
    data["sft"]["utility"] = {"values": [0.9 + 0.001 * g for g in range(n_seeds)]}
    ids = {"prompts": [[f"p{i}" for i in range(n_units)]] * n_seeds}
    return data, ids


def test_retrained_runs_that_come_out_alike_are_kept():
    data, ids = _saturated()
    plain = parse_check("sft.asr >= 0.8 over prompts").evaluate(data, unit_ids=ids)
    assert plain.design["clusters"] == 2 and plain.verdict == "inconclusive"  # a t over 2 "runs"
    check = parse_check("sft.asr >= 0.8 over prompts in retrained runs")
    assert check.retrained and check.text == "sft.asr >= 0.8 over prompts in retrained runs"
    out = check.evaluate(data, unit_ids=ids)
    assert out.design["clusters"] == 25 and out.verdict == "holds"
    assert out.estimate == pytest.approx(1 - 3 / 1500)
    assert "retrained runs: identical seeds kept" in out.units
    # never narrower than the exact interval on the 60 distinct prompts the runs share
    assert out.interval[0] <= clopper_pearson(60, 60)[0]
    assert components(check, data, ids).runs == 25 and components(parse_check(
        "sft.asr >= 0.8 over prompts"), data, ids).runs == 2


def test_collapsing_retrained_runs_biases_a_paired_estimate():
    """spard's polyak_mode: runs where the defence changed nothing are outcomes; dropping their copies made
    the effect look larger than the runs' mean."""
    rng = np.random.default_rng(8)
    base = [np.ones(60) for _ in range(6)]
    method = [np.ones(60) for _ in range(3)] + [(rng.random(60) < 0.5).astype(float) for _ in range(3)]
    data = arms("prompts", m__asr=method, b__asr=base)
    for arm in ("m", "b"):
        data[arm]["utility"] = {"values": list(rng.random(6))}
    ids = {"prompts": [[f"p{i}" for i in range(60)]] * 6}
    kept = parse_check("m.asr - b.asr <= -0.2 over prompts in retrained runs").evaluate(data, unit_ids=ids)
    dropped = parse_check("m.asr - b.asr <= -0.2 over prompts").evaluate(data, unit_ids=ids)
    truth = float(np.mean([(m - b).mean() for m, b in zip(method, base, strict=True)]))
    assert kept.estimate == pytest.approx(truth) and dropped.estimate < truth - 0.1
    assert kept.design["clusters"] == 6 and dropped.design["clusters"] == 4


def test_retrained_needs_evidence_that_the_seed_changes_the_arm():
    """Every metric of the arm the same on every seed: one computation, whatever the card says."""
    data, ids = _saturated()
    data["sft"]["asr"] = arms("prompts", sft__asr=[np.ones(60)] * 25)["sft"]["asr"]
    data["sft"]["utility"] = {"values": [0.9] * 25}
    data["sft"]["train_s"] = {"values": [float(g) for g in range(25)]}  # wall clock is no evidence
    check = parse_check("sft.asr >= 0.8 over prompts in retrained runs")
    out = check.evaluate(data, unit_ids=ids)
    assert out.design["clusters"] == 1
    assert "declared retrained, but no metric of sft differs between seeds: identical seeds counted once" in out.test
    data["sft"]["utility"] = {"values": [math.nan] * 25}  # NaN on every seed does not differ either
    assert check.evaluate(data, unit_ids=ids).design["clusters"] == 1
    data["sft"]["utility"] = {"values": [math.nan] * 24 + [0.5]}
    assert check.evaluate(data, unit_ids=ids).design["clusters"] == 25


def test_retrained_clause_grammar():
    c = parse_check("a.x - b.x >= 0.1   over prompts  in   retrained runs by t")
    assert c.retrained and c.procedure == "t" and c.pairing == "prompts"
    assert not parse_check("a.x >= 0.1 over prompts").retrained
    with pytest.raises(CheckSyntaxError, match="not 'over seeds'"):
        parse_check("a.x >= 0.1 over seeds in retrained runs")
    for bad in ("a.x >= 0.1 exactly in retrained runs", "a.x >= 0.1 over prompts in retrained",
                "a.x >= 0.1 over prompts retrained runs"):
        with pytest.raises(CheckSyntaxError):
            parse_check(bad)
