"""Verdicts v3: every unit carries ids (what it is), and no tested unit is one the run trained or tuned on."""

from __future__ import annotations

import dataclasses

import pytest

from icml26.common.results import aggregate_ids
from icml26.xfedalign.data import load_task
from icml26.xfedalign.experiment import PRESETS, run, trial_ids, world_unit_ids

SMALL = dataclasses.replace(PRESETS["smoke"], worlds=("cancer/iid", "digits/dirichlet"), rounds=2, ig_steps=4,
                            random_draws=1, mia_trials=4, beta_sweep=(0.0,))


@pytest.fixture(scope="module")
def seed_run():
    return run(SMALL)


def test_every_unit_has_ids_matching_its_values(seed_run):
    r = seed_run
    assert set(r.unit_ids) == set(r.units) == {"items", "client_classes", "classes", "trials"}
    for unit, ids in r.unit_ids.items():
        assert len(set(ids)) == len(ids), unit                      # distinct units within a seed
        for arm, metrics in r.units[unit].items():
            for values in metrics.values():
                assert len(values) == len(ids), (unit, arm)
    assert {i.split(":")[0] for i in r.unit_ids["items"]} == {"cancer/iid", "digits/dirichlet"}
    aggregate_ids([r, r])


def test_tested_units_are_disjoint_from_training_and_validation(seed_run):
    r = seed_run
    assert set(r.held_out) == {"items", "trials"}
    assert all(r.held_out["items"][s] for s in ("train", "validation"))
    assert len(r.held_out["trials"]["train"]) == SMALL.mia_trials
    assert r.overlap() == {"items": {"train": 0, "validation": 0}, "trials": {"train": 0, "validation": 0}}


def test_ids_name_the_same_rows_on_every_seed_and_seed_drawn_units_apart():
    a, _ = world_unit_ids(load_task("cancer", "iid", n_clients=6, seed=0), "cancer/iid", 0)
    b, held_b = world_unit_ids(load_task("cancer", "iid", n_clients=6, seed=1), "cancer/iid", 1)
    shared = set(a["items"]) & set(b["items"])
    assert shared                                                   # a fixed pool: test rows recur across seeds
    assert not set(a["client_classes"]) & set(b["client_classes"])  # clients are drawn per seed
    assert not set(b["items"]) & (set(held_b["train"]) | set(held_b["validation"]))
    assert not set(trial_ids("w", 0, 3)[0]) & set(trial_ids("w", 1, 3)[0])
