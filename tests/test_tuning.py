"""The per-arm tuning helper: selection by hand, the edge flag, ties, draws, call order and bad input; and the
bracketed grid search (``common.bracketing``) that extends past an edge choice."""

from __future__ import annotations

import numpy as np
import pytest

from icml26.common.bracketing import tune_bracketed
from icml26.common.tuning import Rule, select, tune_per_arm


def test_hand_computed_selection_and_record():
    table = {("a", 0.1): 0.2, ("a", 0.3): 0.9, ("a", 1.0): 0.5, ("b", 1): 0.4, ("b", 2): 0.1, ("b", 3): 0.7}
    calls = []

    def evaluate(arm, value, draw):
        calls.append((arm, value, draw))
        return table[arm, value], f"{arm}@{value}"

    t = tune_per_arm({"a": [0.1, 0.3, 1.0], "b": (1, 2, 3)}, evaluate)
    assert calls == [("a", 0.1, 0), ("a", 0.3, 0), ("a", 1.0, 0), ("b", 1, 0), ("b", 2, 0), ("b", 3, 0)]
    assert t.chosen == {"a": 0.3, "b": 3}
    assert t.kept == {"a": "a@0.3", "b": "b@3"}
    assert t.record["a"] == {
        "grid": [0.1, 0.3, 1.0],
        "scores": [0.2, 0.9, 0.5],
        "chosen": 0.3,
        "rule": "best mean of 1 validation draw(s), higher is better, ties to the first grid value",
        "at_edge": False,
    }
    assert t.record["b"]["at_edge"] is True and t.at_edge() == ["b"]


def test_mean_over_draws_and_minimise():
    # value 1: draws (1, 5) mean 3; value 2: draws (2, 2) mean 2; value 3: (4, 0) mean 2 -> lowest mean is 2, tie
    scores = {(1, 0): 1.0, (1, 1): 5.0, (2, 0): 2.0, (2, 1): 2.0, (3, 0): 4.0, (3, 1): 0.0}
    t = tune_per_arm({"x": [1, 2, 3]}, lambda arm, v, d: scores[v, d], Rule(draws=2, maximize=False))
    assert t.record["x"]["scores"] == [3.0, 2.0, 2.0]
    assert t.chosen["x"] == 2 and t.record["x"]["at_edge"] is False and t.kept["x"] is None
    last = tune_per_arm({"x": [1, 2, 3]}, lambda arm, v, d: scores[v, d], Rule(draws=2, maximize=False, ties="last"))
    assert last.chosen["x"] == 3 and last.record["x"]["at_edge"] is True
    assert "2 validation draw(s), lower is better, ties to the last" in last.record["x"]["rule"]


def test_ties_go_to_the_stated_side_and_single_value_is_not_an_edge():
    flat = lambda arm, v, d: 0.5  # noqa: E731
    assert tune_per_arm({"a": [1, 2, 3]}, flat).chosen["a"] == 1
    assert tune_per_arm({"a": [1, 2, 3]}, flat, Rule(ties="last")).chosen["a"] == 3
    one = tune_per_arm({"a": [7]}, flat)
    assert one.chosen["a"] == 7 and one.record["a"]["at_edge"] is False
    assert select([1, 2, 3], [0.1, 0.4, 0.4]) == (2, False)
    assert select([1, 2, 3], [0.1, 0.4, 0.4], Rule(ties="last")) == (3, True)
    assert select([1, 2], [0.3, 0.1], Rule(maximize=False)) == (2, True)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: tune_per_arm({}, lambda a, v, d: 0.0), "grids"),
        (lambda: tune_per_arm({"a": []}, lambda a, v, d: 0.0), "grids"),
        (lambda: tune_per_arm({"a": [1, 1]}, lambda a, v, d: 0.0), "grids"),
        (lambda: tune_per_arm({"a": [1]}, lambda a, v, d: float("nan")), "evaluate"),
        (lambda: Rule(draws=0), "draws"),
        (lambda: Rule(draws=1.5), "draws"),
        (lambda: Rule(ties="middle"), "ties"),
        (lambda: select([1, 2], [0.1]), "scores"),
        (lambda: select([], []), "grid"),
        (lambda: select([1], [float("nan")]), "scores"),
    ],
)
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_tune_bracketed_by_hand():
    """Validation scores peaked at a known rate: an interior choice needs no extension; a choice on the low edge
    adds values below it (the grid's first ratio, 10/3: 9e-5, then 2.7e-5) until it is inside or the extensions run out (then flagged); the
    high edge extends upwards; equal scores go to the smaller rate. The artifact is the chosen rate's."""
    calls: list[float] = []

    def peaked(at):
        def score(lr):
            calls.append(lr)
            return -abs(np.log(lr / at)), f"pol@{lr:.3g}"

        return score

    rec, art = tune_bracketed((3e-4, 1e-3, 3e-3), peaked(1e-3), extend=1)
    assert rec["chosen"] == 1e-3 and not rec["at_edge"] and art == "pol@0.001" and len(calls) == 3
    rec, art = tune_bracketed((3e-4, 1e-3, 3e-3), peaked(5e-5), extend=1)
    np.testing.assert_allclose(rec["grid"], [9e-5, 3e-4, 1e-3, 3e-3])
    assert rec["chosen"] == pytest.approx(9e-5) and rec["at_edge"] and art == "pol@9e-05"
    rec, _ = tune_bracketed((3e-4, 1e-3, 3e-3), peaked(1e-4), extend=2)
    np.testing.assert_allclose(rec["grid"], [2.7e-5, 9e-5, 3e-4, 1e-3, 3e-3])
    assert rec["chosen"] == pytest.approx(9e-5) and not rec["at_edge"]
    rec, _ = tune_bracketed((3e-4, 1e-3, 3e-3), peaked(3e-2), extend=1)
    np.testing.assert_allclose(rec["grid"], [3e-4, 1e-3, 3e-3, 1e-2])
    assert rec["chosen"] == pytest.approx(1e-2) and rec["at_edge"]
    rec, _ = tune_bracketed((3e-4, 1e-3, 3e-3), lambda lr: (0.5, None), extend=0)
    assert rec["chosen"] == 3e-4 and rec["at_edge"] and rec["scores"] == [0.5, 0.5, 0.5]
    for bad in ((1e-3,), (1e-3, 1e-4), (0.0, 1e-3)):
        with pytest.raises(ValueError, match="grid"):
            tune_bracketed(bad, peaked(1e-3), extend=1)
    with pytest.raises(ValueError, match="extend"):
        tune_bracketed((1e-3, 3e-3), peaked(1e-3), extend=-1)
    with pytest.raises(ValueError, match="NaN"):
        tune_bracketed((1e-3, 3e-3), lambda lr: (float("nan"), None), extend=0)
