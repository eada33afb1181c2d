"""Verdicts v3: what each held-out item is (its row or its sentence), and no held-out item among the anchors.

``SeedRun.unit_ids`` holds one id list per unit, while the metrics of ``items`` list one model set's items or all
three, so the ids travel in ``series`` (README, Deviations); these tests check them there."""

from __future__ import annotations

import dataclasses

import numpy as np

from icml26.common.datasets import digits
from icml26.gcpa.data import digits_rows, tabular_views, text_id
from icml26.gcpa.experiment import PRESETS, item_ids, run


def test_every_per_item_metric_has_one_id_per_item_and_none_is_an_anchor():
    out = run(dataclasses.replace(PRESETS["smoke"], datasets=("tabular",)))
    by_metric = out.series["unit_ids"]["items"]
    held = out.series["held_out"]["items"]
    for arm, metrics in out.units["items"].items():
        assert set(metrics) == set(by_metric), arm
        for name, values in metrics.items():
            assert len(values) == len(by_metric[name]), (arm, name)
    test = set(by_metric["all_recall_at_1"])
    assert len(test) == len(by_metric["all_recall_at_1"])
    assert held["train"] and held["validation"] and set(held["validation"]) <= set(held["train"])
    assert not test & set(held["train"]) and not test & set(held["validation"])


def test_ids_name_the_same_items_on_every_seed():
    a, b = (tabular_views(s, max_iter=5) for s in (0, 1))
    assert set(a.test_ids) & set(b.test_ids)                       # a fixed pool, split anew by each seed
    assert set(a.test_ids) | set(a.train_ids) == {f"breast_cancer:row{i}" for i in range(569)}
    test, held = item_ids(a, PRESETS["quick"])
    assert not set(test) & set(held["train"])
    # the digits rows are those of common.datasets.digits' split; a sentence's id is its text
    split, (tr, te) = digits(seed=3), digits_rows(3)
    from sklearn.datasets import load_digits

    y = load_digits().target
    assert np.array_equal(y[tr], split.y_train) and np.array_equal(y[te], split.y_test)
    assert text_id("a b") == text_id("a b") != text_id("a  b")
