"""Verdicts v3: every unit carries the scenario ids it measured, the same on every seed, and no held-out test unit
is one the run learned from."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("lark")

from icml26.air.experiment import ARMS, PRESETS, family_halves, heldout_incident_splits, run, run_agent_type
from icml26.air.worlds.embedded import FAMILIES, scenarios
from icml26.common.results import aggregate_ids


@pytest.fixture(scope="module")
def two_seeds():
    cfg = dataclasses.replace(PRESETS["smoke"], agent_types=("email",), arms=ARMS)
    return run(cfg), run(dataclasses.replace(cfg, seed=1))


def test_every_unit_has_scenario_ids_the_same_on_every_seed(two_seeds):
    a, b = two_seeds
    assert set(a.unit_ids) == set(a.units)
    known = {s.id: s for s in scenarios("email")}
    for unit, ids in a.unit_ids.items():
        assert len(set(ids)) == len(ids), unit                  # one episode per scenario within a seed
        assert set(ids) <= set(known), unit
        for arm, metrics in a.units[unit].items():
            for values in metrics.values():
                assert len(values) == len(ids), (unit, arm)
        if unit != "detected_reversible_incidents":             # the rest is the same scenarios on every seed
            assert b.unit_ids[unit] == ids, unit
    assert all(not known[i].benign and known[i].held_out for i in a.unit_ids["heldout_incidents"])
    assert all(known[i].benign for i in a.unit_ids["benign_twins"])
    assert all(known[i].benign and known[i].held_out for i in a.unit_ids["heldout_benign_twins"])
    assert set(a.unit_ids["heldout_benign_twins"]) < set(a.unit_ids["benign_twins"])
    aggregate_ids([a, b])


def test_heldout_units_are_disjoint_from_the_eradication_and_validation_scenarios(two_seeds):
    a, _ = two_seeds
    splits = a.held_out["heldout_incidents"]
    assert splits == heldout_incident_splits(("email",), PRESETS["smoke"].families)
    assert splits["train"] and splits["validation"]
    test = set(a.unit_ids["heldout_incidents"])
    assert test.isdisjoint(splits["train"]) and test.isdisjoint(splits["validation"])
    # the false-positive claims count only benign twins the validator never saw (its traces are the dev twins)
    assert a.held_out["heldout_benign_twins"] == splits
    benign = set(a.unit_ids["heldout_benign_twins"])
    assert benign and benign.isdisjoint(splits["validation"])
    assert a.overlap() == {unit: {"train": 0, "validation": 0} for unit in ("heldout_incidents", "heldout_benign_twins")}
    # the whole benign set would overlap the validator's traces: it must never be declared held out
    assert set(a.unit_ids["benign_twins"]) & set(splits["validation"])


def test_whole_family_folds_test_only_families_the_fold_never_eradicated_from():
    fams = FAMILIES["household"][:4]
    halves = family_halves(fams)
    assert set(halves[0]).isdisjoint(halves[1])
    rows, _ = run_agent_type("household", "families_template", dataclasses.replace(PRESETS["smoke"], families=4))
    # rows come fold by fold: first the second half (developed on the first), then the first half
    n = sum(1 for s, _ in rows if s.family in halves[1])
    assert {s.family for s, _ in rows[:n]} <= set(halves[1])
    assert {s.family for s, _ in rows[n:]} <= set(halves[0])
