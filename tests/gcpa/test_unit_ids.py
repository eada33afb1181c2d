"""Verdicts v3: what each held-out item is (its row or its sentence), and no held-out item among the anchors.

The pooled ``all_*`` metrics of ``items`` carry the unit's ids (``unit_ids["items"]``), each per-set metric its
own (``unit_ids["arm.<set>_<metric>"]``); the held-out sets are keyed alike."""

from __future__ import annotations

import dataclasses

import numpy as np

from icml26.common.datasets import digits
from icml26.gcpa.data import digits_rows, tabular_views, text_id
from icml26.gcpa.experiment import DATASETS, PRESETS, item_ids, run


def ids_of(out, arm: str, metric: str) -> list[str]:
    """The ids a check over ``arm.metric`` uses: its own, else its unit name's."""
    return out.unit_ids.get(f"{arm}.{metric}", out.unit_ids.get(out.unit_of(arm, metric)))


def test_every_per_item_metric_has_one_id_per_item_and_none_is_an_anchor():
    cfg = dataclasses.replace(PRESETS["smoke"], datasets=("tabular", "digits"), digits_steps=20, tabular_max_iter=50)
    out = run(cfg)
    assert "unit_ids" not in out.series and "held_out" not in out.series
    for arm, metrics in out.units["items"].items():
        for name, values in metrics.items():
            ids = ids_of(out, arm, name)
            assert ids is not None and len(ids) == len(values), (arm, name)
            # a per-set metric's ids are that set's items (a row of the bundled data set, or a sentence)
            if not name.startswith("all_"):
                assert f"{arm}.{name}" in out.unit_ids and out.unit_ids[f"{arm}.{name}"] == ids
                prefix = {"digits": "digits:", "tabular": "breast_cancer:"}[name.split("_", 1)[0]]
                assert all(u.startswith(prefix) for u in ids), (arm, name)
    # the pooled metrics list every set's items in DATASETS order (those of the unit name)
    pooled = out.unit_ids["items"]
    assert len(pooled) == len(set(pooled))
    assert pooled == [u for d in DATASETS if d in cfg.datasets for u in out.unit_ids[f"gcpa.{d}_recall_at_1"]]
    # the held-out sets: keyed like the ids, the validation anchors a subset of the anchors, no test item there
    assert set(out.held_out) == set(out.unit_ids)
    for key, held in out.held_out.items():
        assert held["train"] and held["validation"] and set(held["validation"]) <= set(held["train"]), key
    assert out.held_out["gcpa.tabular_recall_at_1"]["train"] == item_ids(
        tabular_views(cfg.seed, max_iter=cfg.tabular_max_iter), cfg)[1]["train"]
    assert all(n == 0 for splits in out.overlap().values() for n in splits.values())


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
