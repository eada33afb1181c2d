"""The check language of the cards: parsing, seeds, NaN, mismatches, against hand-computed outcomes."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from icml26.common.claims import CheckSyntaxError, describe_stat, ours_text, parse_check


def arms(**series):
    """arms(a_acc=[...]) -> {"a": {"acc": {"values": [...], "mean", "std"}}}"""
    out: dict = {}
    for key, values in series.items():
        arm, metric = key.split("__")
        mean = sum(values) / len(values)
        out.setdefault(arm, {})[metric] = {"values": list(values), "mean": mean, "std": 0.0}
    return out


def test_parse_absolute_difference_ratio():
    c = parse_check("gcpa.recall_at_1 >= 0.5")
    assert (c.method.arm, c.method.metric, c.baseline, c.op, c.threshold, c.scope) == (
        "gcpa", "recall_at_1", None, ">=", 0.5, "mean")
    c = parse_check("a.x - b.y < -1e-3 on all seeds")
    assert (c.combine, str(c.baseline), c.threshold, c.scope) == ("-", "b.y", -1e-3, "all")
    c = parse_check("  a.x / b.x <= 0.7 on >= 2 of 3 seeds ")
    assert (c.combine, c.k, c.n, c.scope, c.text) == ("/", 2, 3, "k_of_n", "a.x / b.x <= 0.7 on >= 2 of 3 seeds")


@pytest.mark.parametrize("bad", [
    "", "a >= 1", "a.x >= b", "a.x == 1", "a.x + b.x >= 1", "a.x >= 1 on some seeds", "a.x >= 1 on >= 4 of 3 seeds",
    "a.x >= 1 on >= 0 of 3 seeds", "__import__('os').x >= 1", "a.x >= 1; rm", "a.b.c >= 1",
])
def test_parse_rejects(bad):
    with pytest.raises(CheckSyntaxError):
        parse_check(bad)


def test_parse_type_error():
    with pytest.raises(TypeError, match="check must be a string"):
        parse_check(0.5)  # type: ignore[arg-type]


def test_k_of_n_by_hand():
    c = parse_check("m.acc - b.acc >= 0.05 on >= 2 of 3 seeds")
    # per-seed differences 0.1, 0.0, 0.06 -> two pass
    out = c.evaluate(arms(m__acc=[0.9, 0.8, 0.76], b__acc=[0.8, 0.8, 0.70]))
    assert (out.holds, out.passed, out.needed, out.evaluated) == (True, 2, 2, 3)
    assert out.value == pytest.approx(0.82 - 0.7666666666666666)
    out = c.evaluate(arms(m__acc=[0.9, 0.8, 0.72], b__acc=[0.8, 0.8, 0.70]))
    assert (out.holds, out.passed) == (False, 1)
    assert "1 of 3 seed(s), needs 2" in out.why


def test_needed_seeds_scales_with_the_run():
    c = parse_check("m.a >= 0 on >= 2 of 3 seeds")
    assert [c.needed_seeds(n) for n in (1, 2, 3, 5, 6)] == [1, 2, 2, 4, 4]
    assert parse_check("m.a >= 0 on all seeds").needed_seeds(5) == 5
    assert parse_check("m.a >= 0").needed_seeds(5) == 1


def test_mean_and_all_scopes():
    a = arms(m__x=[1.0, 3.0])
    assert parse_check("m.x >= 2 on mean").evaluate(a).holds
    assert not parse_check("m.x >= 2 on all seeds").evaluate(a).holds
    assert parse_check("m.x > 0.5 on all seeds").evaluate(a).holds


def test_ratio_and_zero_baseline():
    out = parse_check("m.t / b.t < 1.0 on mean").evaluate(arms(m__t=[30.0], b__t=[60.0]))
    assert out.holds and out.value == 0.5
    out = parse_check("m.t / b.t < 1.0 on mean").evaluate(arms(m__t=[30.0], b__t=[0.0]))
    assert not out.holds and math.isinf(out.value)


def test_nan_never_holds():
    out = parse_check("m.x <= 10 on mean").evaluate(arms(m__x=[1.0, float("nan")]))
    assert not out.holds and "NaN" in out.why


def test_missing_arm_or_metric_is_an_error():
    c = parse_check("m.x - b.x >= 0")
    with pytest.raises(KeyError, match="arm 'b' was not measured"):
        c.evaluate(arms(m__x=[1.0]))
    with pytest.raises(KeyError, match="metric 'x' of arm 'b'"):
        c.evaluate(arms(m__x=[1.0], b__y=[1.0]))
    with pytest.raises(ValueError, match="different"):
        c.evaluate(arms(m__x=[1.0, 2.0], b__x=[1.0]))


def test_ours_text_and_describe_stat():
    a = {"m": {"acc": {"mean": 0.8125, "std": 0.0141, "values": [0.8, 0.825]}},
         "b": {"acc": {"mean": 0.7, "std": 0.0, "values": [0.7, 0.7]}}}
    text = ours_text(parse_check("m.acc - b.acc >= 0.05"), a)
    assert text == "m.acc = 0.812 ± 0.0141 vs b.acc = 0.7 ± 0 (difference 0.1125)"
    assert describe_stat({"mean": 6863.0, "std": 0.0, "values": [6863.0]}) == "6863"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=7), st.floats(-1e6, 1e6))
def test_mean_scope_is_the_comparison_of_means(values, threshold):
    out = parse_check(f"m.x >= {threshold!r} on mean").evaluate(arms(m__x=values))
    assert out.holds == (sum(values) / len(values) >= threshold)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(-100, 100), st.floats(-100, 100)), min_size=1, max_size=9))
def test_all_scope_is_every_seed(pairs):
    a = arms(m__x=[p[0] for p in pairs], b__x=[p[1] for p in pairs])
    out = parse_check("m.x - b.x > 0 on all seeds").evaluate(a)
    assert out.holds == all(x - y > 0 for x, y in pairs)
