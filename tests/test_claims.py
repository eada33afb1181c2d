"""The check language: parsing, and every verdict against scipy's statistics or values computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from icml26.common.claims import (
    CheckSyntaxError,
    agresti_min_interval,
    clopper_pearson,
    describe_interval,
    describe_stat,
    ours_text,
    parse_check,
)


def arms(**series):
    """arms(a__acc=[...]) -> per-seed values; arms(a__acc=[[...], [...]], unit="prompts") -> per-unit values."""
    unit = series.pop("unit", None)
    out: dict = {}
    for key, values in series.items():
        arm, metric = key.split("__")
        if unit is None:
            per_seed = [float(v) for v in values]
            stat = {"values": per_seed}
        else:
            per_seed = [float(np.mean(v)) for v in values]
            stat = {"values": per_seed, "unit": unit, "unit_values": [list(map(float, v)) for v in values]}
        stat["mean"] = float(np.mean(per_seed))
        stat["std"] = float(np.std(per_seed, ddof=1)) if len(per_seed) > 1 else 0.0
        out.setdefault(arm, {})[metric] = stat
    return out


# -- parsing --------------------------------------------------------------------------------------------
def test_parse_forms():
    c = parse_check("gcpa.recall_at_1 >= 0.5 over seeds")
    assert (str(c.method), c.baseline, c.op, c.threshold, c.pairing, c.procedure) == (
        "gcpa.recall_at_1", None, ">=", 0.5, "seeds", None)
    c = parse_check("a.x - b.y < -1e-3 over prompts by bootstrap")
    assert (c.combine, str(c.baseline), c.threshold, c.pairing, c.procedure) == ("-", "b.y", -1e-3, "prompts",
                                                                                  "bootstrap")
    c = parse_check("  a.x / b.x <= 0.7   exactly ")
    assert (c.combine, c.deterministic, c.text) == ("/", True, "a.x / b.x <= 0.7 exactly")
    c = parse_check("|a.x - b.x| <= 0.05 over items")
    assert c.equivalence and c.comparative and c.quantity_name == "|a.x - b.x|"


@pytest.mark.parametrize("bad", [
    "", "a >= 1 over seeds", "a.x >= b over seeds", "a.x == 1 over seeds", "a.x + b.x >= 1 over seeds",
    "a.x >= 1", "a.x >= 1 on mean", "a.x >= 1 on >= 2 of 3 seeds", "a.x >= 1 over", "a.x >= 1 over seeds by z",
    "__import__('os').x >= 1 over seeds", "a.x >= 1 over seeds; rm", "a.b.c >= 1 over seeds",
    "|a.x - b.x| >= 0.1 over seeds", "|a.x| <= 0.1 over seeds", "|a.x / b.x| <= 0.1 over seeds",
    "a.x - b.x| <= 0.1 over seeds", "a.x / b.x >= 0 over seeds", "|a.x - b.x| <= 0 over seeds",
    "a.x >= 1 exactly by t", "a.x >= 1 over seeds by exact",
])
def test_parse_rejects(bad):
    with pytest.raises(CheckSyntaxError):
        parse_check(bad)


def test_parse_type_error():
    with pytest.raises(TypeError, match="check must be a string"):
        parse_check(0.5)  # type: ignore[arg-type]


# -- the statistics against scipy -----------------------------------------------------------------------
def test_paired_t_bounds_match_scipy():
    rng = np.random.default_rng(3)
    a, b = rng.normal(1.0, 1.0, 40), rng.normal(0.6, 1.0, 40)
    out = parse_check("m.x - b.x >= 0.1 over items").evaluate(arms(m__x=[a], b__x=[b], unit="items"))
    d = a - b
    lo90, hi90 = stats.ttest_1samp(d, 0.0).confidence_interval(confidence_level=0.90)
    assert out.interval == pytest.approx((lo90, hi90), rel=1e-10)
    assert out.estimate == pytest.approx(d.mean(), rel=1e-12)
    # scipy's one-sided test at the threshold agrees with the verdict
    p_greater = stats.ttest_1samp(d, 0.1, alternative="greater").pvalue
    p_less = stats.ttest_1samp(d, 0.1, alternative="less").pvalue
    expected = "holds" if p_greater <= 0.05 else ("fails" if p_less < 0.05 else "inconclusive")
    assert out.verdict == expected and out.test == "paired t; within one run (seed-to-seed variance not measured)"
    assert out.units == "40 distinct items in 1 run(s) (40 per seed x 1 seed(s); no unit ids recorded: taken as distinct), paired"


def test_clopper_pearson_matches_scipy_binomtest():
    for k, n in [(0, 20), (3, 20), (20, 20), (7, 450), (31, 450)]:
        ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.90, method="exact")
        assert clopper_pearson(k, n) == pytest.approx((ci.low, ci.high), abs=1e-12)
    with pytest.raises(ValueError, match="0 <= k <= n"):
        clopper_pearson(5, 3)


def test_rate_claim_uses_clopper_pearson():
    # a type-I error claim: 31 rejections of 450 H0 replications (3 seeds x 150)
    rej = np.zeros(450)
    rej[:31] = 1
    rng = np.random.default_rng(0)
    rng.shuffle(rej)
    a = arms(m__reject=[rej[:150], rej[150:300], rej[300:]], unit="replications")
    out = parse_check("m.reject <= 0.1 over replications").evaluate(a)
    ci = stats.binomtest(31, 450).proportion_ci(confidence_level=0.90, method="exact")
    if out.test.startswith("Clopper"):  # no heterogeneity across seeds
        assert out.interval == pytest.approx((ci.low, ci.high), abs=1e-12)
        assert out.verdict == ("holds" if ci.high <= 0.1 else "inconclusive")
    assert "31 of 450" in out.test


def test_agresti_min_by_hand():
    # b = 12, c = 2 discordant of 100: cells + 0.5 -> b* = 12.5, c* = 2.5, n* = 102
    d = 10 / 102
    var = (15 - 10**2 / 102) / 102**2
    half = 1.6448536269514722 * math.sqrt(var)
    assert agresti_min_interval(12, 2, 86) == pytest.approx((d - half, d + half), abs=1e-12)
    # symmetric in the two arms; all concordant still leaves room on both sides
    lo, hi = agresti_min_interval(2, 12, 86)
    assert (lo, hi) == pytest.approx((-(d + half), -(d - half)))
    lo0, hi0 = agresti_min_interval(0, 0, 6)
    assert lo0 == pytest.approx(-hi0) and hi0 > 0.2
    with pytest.raises(ValueError):
        agresti_min_interval(0, 0, 0)
    with pytest.raises(ValueError):
        agresti_min_interval(1, -1, 3)


@pytest.mark.parametrize("n, cells", [(40, (0.30, 0.15, 0.05, 0.50)), (30, (0.85, 0.05, 0.05, 0.05)),
                                      (200, (0.40, 0.08, 0.04, 0.48)), (12, (0.5, 0.0, 0.0, 0.5)),
                                      (20, (0.1, 0.3, 0.1, 0.5))])
def test_agresti_min_bounds_keep_their_coverage(n, cells):
    # each one-sided 95 % bound covers the true difference in at least ~92 % of simulated tables (the
    # interval is approximate; Fagerland et al. 2014 report the same near-nominal behaviour)
    rng = np.random.default_rng(11)
    true = cells[1] - cells[2]
    tables = rng.multinomial(n, cells, size=3000)
    bounds = np.array([agresti_min_interval(int(t[1]), int(t[2]), int(t[0] + t[3])) for t in tables])
    assert (bounds[:, 0] <= true + 1e-12).mean() >= 0.915
    assert (bounds[:, 1] >= true - 1e-12).mean() >= 0.915


def test_paired_binary_difference_uses_agresti_min():
    m = np.array([1] * 30 + [0] * 10 + [1] * 5 + [0] * 55)
    b = np.array([1] * 30 + [0] * 10 + [0] * 5 + [0] * 55)
    b[40:42] = 1  # two pairs favour the baseline
    m[40:42] = 0
    out = parse_check("m.ok - b.ok >= 0.0 over episodes").evaluate(arms(m__ok=[m], b__ok=[b], unit="episodes"))
    cells = [int(((m == x) & (b == y)).sum()) for x, y in ((1, 1), (1, 0), (0, 1), (0, 0))]
    assert out.interval == pytest.approx(agresti_min_interval(cells[1], cells[2], cells[0] + cells[3]))
    assert out.test == "Agresti-Min paired (3 vs 2 discordant of 100); within one run (seed-to-seed variance not measured)"
    # few pairs, all concordant: inconclusive, never "fails" on no evidence
    few = parse_check("m.ok - b.ok >= 0.05 over episodes").evaluate(
        arms(m__ok=[[1, 0, 1, 0, 1, 1]], b__ok=[[1, 0, 1, 0, 1, 1]], unit="episodes"))
    assert few.verdict == "inconclusive"


def test_bootstrap_is_seeded_and_close_to_t():
    rng = np.random.default_rng(1)
    a = [rng.normal(0.3, 1, 600)]
    c = parse_check("m.x >= 0.1 over items by bootstrap")
    one = c.evaluate(arms(m__x=a, unit="items"))
    two = c.evaluate(arms(m__x=a, unit="items"))
    t = parse_check("m.x >= 0.1 over items by t").evaluate(arms(m__x=a, unit="items"))
    assert one == two and one.test.startswith("bootstrap")
    assert one.interval == pytest.approx(t.interval, abs=0.02)


def test_ratio_is_a_paired_log_ratio():
    m, b = [30.0, 40.0, 50.0, 45.0], [60.0, 70.0, 80.0, 90.0]
    out = parse_check("m.t / b.t <= 0.8 over seeds").evaluate(arms(m__t=m, b__t=b))
    logs = np.log(np.array(m) / np.array(b))
    lo, hi = stats.ttest_1samp(logs, 0.0).confidence_interval(confidence_level=0.90)
    assert out.estimate == pytest.approx(math.exp(logs.mean()))
    assert out.interval == pytest.approx((math.exp(lo), math.exp(hi)))
    assert out.verdict == ("holds" if math.exp(hi) <= 0.8 else "inconclusive")
    bad = parse_check("m.t / b.t <= 0.8 over seeds").evaluate(arms(m__t=[1.0, 0.0], b__t=[1.0, 1.0]))
    assert bad.verdict == "inconclusive" and "positive" in bad.why


def test_equivalence_is_tost():
    rng = np.random.default_rng(5)
    a = rng.normal(0.50, 0.05, 300)
    b = a + rng.normal(0.0, 0.05, 300)
    c = parse_check("|m.x - b.x| <= 0.02 over items")
    out = c.evaluate(arms(m__x=[a], b__x=[b], unit="items"))
    d = a - b
    # TOST: both one-sided tests against -0.02 and +0.02 reject at 5 %
    p_low = stats.ttest_1samp(d, -0.02, alternative="greater").pvalue
    p_high = stats.ttest_1samp(d, 0.02, alternative="less").pvalue
    assert (out.verdict == "holds") == (max(p_low, p_high) < 0.05)
    assert out.verdict == "holds"
    far = c.evaluate(arms(m__x=[a + 0.2], b__x=[b], unit="items"))
    assert far.verdict == "fails"
    few = c.evaluate(arms(m__x=[a[:4]], b__x=[b[:4] + 0.01], unit="items"))
    assert few.verdict == "inconclusive"


def test_three_verdicts_by_hand():
    c = parse_check("m.x - b.x >= 0.05 over seeds")
    # differences 0.2, 0.13, 0.19: t(0.95, 2) = 2.919986 -> lower bound 0.1094 -> holds
    out = c.evaluate(arms(m__x=[0.9, 0.85, 0.88], b__x=[0.7, 0.72, 0.69]))
    assert out.verdict == "holds" and out.interval[0] == pytest.approx(0.10943, abs=1e-4)
    # differences 0.06, -0.02, 0.10: the interval straddles 0.05 -> inconclusive
    assert c.evaluate(arms(m__x=[0.76, 0.70, 0.80], b__x=[0.70, 0.72, 0.70])).verdict == "inconclusive"
    # differences -0.01, 0.0, -0.02: upper bound below 0.05 -> fails
    assert c.evaluate(arms(m__x=[0.69, 0.72, 0.68], b__x=[0.70, 0.72, 0.70])).verdict == "fails"
    # the mean points the claimed way but the seeds disagree (the old "2 of 3 seeds" case): not "holds"
    noisy = c.evaluate(arms(m__x=[0.755, 0.715, 0.625], b__x=[0.70, 0.70, 0.70]))
    assert noisy.verdict != "holds"


def test_heterogeneous_seeds_are_decided_over_run_means():
    rng = np.random.default_rng(2)
    # within each seed the difference is precise, but the seeds disagree: +0.3, +0.1, -0.25
    seeds = [rng.normal(mu, 0.05, 100) for mu in (0.3, 0.1, -0.25)]
    zeros = [np.zeros(100)] * 3
    out = parse_check("m.x - b.x >= 0.05 over items").evaluate(arms(m__x=seeds, b__x=zeros, unit="items"))
    assert out.test.startswith("t over 3 run means (2 df)") and out.verdict == "inconclusive"
    means = np.array([s.mean() for s in seeds])
    lo, hi = stats.ttest_1samp(means, 0.0).confidence_interval(confidence_level=0.90)
    assert out.interval == pytest.approx((lo, hi))
    # rare 0/1 outcomes (a type-I error): bounds stay in [0, 1]
    rare = [(rng.random(150) < 0.05).astype(float) for _ in range(3)]
    rate = parse_check("m.r <= 0.07 over replications").evaluate(arms(m__r=rare, unit="replications"))
    assert 0.0 <= rate.interval[0] <= rate.interval[1] <= 1.0


def test_operators_mirror():
    a = arms(m__x=[0.1, 0.12, 0.11])
    assert parse_check("m.x <= 0.2 over seeds").evaluate(a).verdict == "holds"
    assert parse_check("m.x < 0.05 over seeds").evaluate(a).verdict == "fails"
    assert parse_check("m.x > 0.05 over seeds").evaluate(a).verdict == "holds"
    assert parse_check("m.x >= 0.5 over seeds").evaluate(a).verdict == "fails"


def test_exactly_is_for_deterministic_arms():
    a = arms(m__n=[6863.0, 6863.0], b__n=[11.0, 11.0])
    out = parse_check("m.n / b.n >= 10 exactly").evaluate(a)
    assert out.verdict == "holds" and out.estimate == pytest.approx(623.9090909) and out.test.startswith("exact")
    assert describe_interval(out) == "624 (exact)"
    assert parse_check("m.n / b.n >= 1000 exactly").evaluate(a).verdict == "fails"
    with pytest.raises(ValueError, match="differs between seeds"):
        parse_check("m.n >= 1 exactly").evaluate(arms(m__n=[1.0, 2.0]))


def test_nan_one_unit_and_mismatches():
    out = parse_check("m.x <= 10 over seeds").evaluate(arms(m__x=[1.0, float("nan")]))
    assert out.verdict == "inconclusive" and "NaN" in out.why
    out = parse_check("m.x <= 10 over seeds").evaluate(arms(m__x=[1.0]))
    assert out.verdict == "inconclusive" and "one paired unit" in out.why
    c = parse_check("m.x - b.x >= 0.1 over seeds")
    with pytest.raises(KeyError, match="arm 'b' was not measured"):
        c.evaluate(arms(m__x=[1.0]))
    with pytest.raises(KeyError, match="metric 'x' of arm 'b'"):
        c.evaluate(arms(m__x=[1.0], b__y=[1.0]))
    with pytest.raises(ValueError, match="different"):
        c.evaluate(arms(m__x=[1.0, 2.0], b__x=[1.0]))
    with pytest.raises(ValueError, match="no per-unit values"):
        parse_check("m.x >= 1 over prompts").evaluate(arms(m__x=[1.0, 2.0]))
    with pytest.raises(ValueError, match="paired units must match"):
        parse_check("m.x - b.x >= 0.1 over items").evaluate(arms(m__x=[[1, 2, 3]], b__x=[[1, 2]], unit="items"))
    with pytest.raises(ValueError, match="needs 0/1"):
        parse_check("m.x >= 0.1 over seeds by binomial").evaluate(arms(m__x=[0.5, 0.7]))
    # per-seed values that happen to be 0 are real numbers, not 0/1 outcomes
    growth = parse_check("m.g <= 0.05 over seeds").evaluate(arms(m__g=[0.0] * 5))
    assert growth.test.startswith("exact: deterministic arms (identical on all 5 seeds") and growth.verdict == "holds"
    assert growth.design["clusters"] == 1


def test_ours_text_and_describe_stat():
    a = arms(m__acc=[0.8, 0.825, 0.81], b__acc=[0.7, 0.7, 0.7])
    text = ours_text(parse_check("m.acc - b.acc >= 0.05 over seeds"), a)
    assert text == "m.acc = 0.812 ± 0.0126 vs b.acc = 0.7; difference 0.112 [0.0905, 0.133]"
    assert describe_stat({"mean": 6863.0, "std": 0.0, "values": [6863.0]}) == "6863"
    assert describe_stat({"mean": 2.0, "std": 0.0, "values": [2.0, 2.0]}) == "2"
    # all-NaN seeds read the same whether the NaNs are distinct objects (as computed) or one (as JSON reads them)
    nan = float("nan")
    computed = describe_stat({"mean": nan, "std": nan, "values": [float("nan"), float("nan")]})
    assert computed == describe_stat({"mean": nan, "std": nan, "values": [nan, nan]}) == "nan ± nan"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-100, 100), min_size=2, max_size=9), st.floats(-100, 100))
def test_verdict_is_consistent_with_its_bounds(values, threshold):
    out = parse_check(f"m.x >= {threshold!r} over seeds").evaluate(arms(m__x=values))
    lo, hi = out.interval
    assert lo <= out.estimate <= hi or math.isclose(lo, hi)
    assert out.verdict == ("holds" if lo >= threshold else ("fails" if hi < threshold else "inconclusive"))
    mirrored = parse_check(f"m.x <= {threshold!r} over seeds").evaluate(arms(m__x=values))
    assert mirrored.interval == out.interval
    # the same interval cannot make both directions hold, unless it is the threshold itself
    assert not (out.verdict == mirrored.verdict == "holds") or lo == hi == threshold
