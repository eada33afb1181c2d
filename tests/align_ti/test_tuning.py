"""Align-TI's learning-rate choice (bracketed, issue #54), the stage-2 budget rule (README Deviation 13) and what they
read: validation questions and the lab seed's draws, never a test question."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("transformers")

from icml26.align_ti import experiment
from icml26.align_ti.experiment import ARMS, HEADLINE, PRESETS
from icml26.common.grid_notes import lr_edge_note
from icml26.common.tiny_vlm import item_ids

SMOKE = PRESETS["smoke"]
GRID = (1e-3, 2e-3, 4e-3)
CFG = dataclasses.replace(SMOKE, lr_grid=GRID, lr_extend=2)


def peak(at: float):
    """A validation score that falls off with the distance (in log rate) from ``at``."""
    return lambda lr: 1.0 - abs(np.log(lr / at))


def stub(monkeypatch, scores):
    """``validation_accuracy`` from ``scores[arm](lr)``; returns the list of (arm, lr) it was asked."""
    asked = []

    def fake(cfg, arm, lr, parts):
        asked.append((arm, float(lr)))
        return float(scores[arm](lr))

    monkeypatch.setattr(experiment, "validation_accuracy", fake)
    return asked


def test_an_interior_choice_stays_on_the_grid(monkeypatch):
    asked = stub(monkeypatch, {"sft": peak(2e-3)})
    got = experiment.tune_arm(CFG, "sft", None)
    assert got["lr"] == pytest.approx(2e-3) and not got["at_edge"]
    assert got["grid"] == pytest.approx(list(GRID)) and sorted(lr for _, lr in asked) == pytest.approx(list(GRID))
    assert got["val_accuracy"] == pytest.approx(1.0)
    assert experiment.tuning_metrics(got) == {"lr": pytest.approx(2e-3), "val_accuracy": 1.0, "lr_at_edge": 0.0,
                                              "lr_grid_min": pytest.approx(1e-3), "lr_grid_max": pytest.approx(4e-3)}


def test_an_edge_choice_extends_the_grid_and_is_flagged_when_still_on_an_edge(monkeypatch):
    """Below the grid: two extensions (5e-4, 2.5e-4), the choice still on the lower edge, flagged. Above it: one
    extension (8e-3) wins, the next (1.6e-2) loses, so the choice is inside the widened grid. ``lr_extend=0``:
    the grid as given, the edge choice flagged."""
    asked = stub(monkeypatch, {"sft": peak(1e-4), "vanilla_kd": peak(8e-3)})
    low = experiment.tune_arm(CFG, "sft", None)
    assert low["lr"] == pytest.approx(2.5e-4) and low["at_edge"]
    assert low["grid"] == pytest.approx([2.5e-4, 5e-4, *GRID])
    assert experiment.tuning_metrics(low)["lr_at_edge"] == 1.0
    assert experiment.tuning_metrics(low)["lr_grid_min"] == pytest.approx(2.5e-4)
    high = experiment.tune_arm(CFG, "vanilla_kd", None)
    assert high["lr"] == pytest.approx(8e-3) and not high["at_edge"]
    assert high["grid"] == pytest.approx([*GRID, 8e-3, 1.6e-2])
    assert sorted(lr for arm, lr in asked if arm == "vanilla_kd") == pytest.approx([*GRID, 8e-3, 1.6e-2])
    fixed = experiment.tune_arm(dataclasses.replace(CFG, lr_extend=0), "sft", None)
    assert fixed["lr"] == pytest.approx(1e-3) and fixed["at_edge"] and len(fixed["grid"]) == 3
    note = lr_edge_note(CFG.lr_extend, {"sft": low, "vanilla_kd": high})
    assert note.startswith("learning rate on the edge of its grid after 2 extension(s) for sft (0.00025 of")
    assert "vanilla_kd" not in note
    assert lr_edge_note(CFG.lr_extend, {"vanilla_kd": high}) is None


def test_every_trained_arm_is_tuned_and_the_more_steps_arms_take_vanilla_kds_choice(monkeypatch):
    asked = stub(monkeypatch, {arm: peak(1e-4 if arm == "align_ti" else 2e-3) for arm in ARMS})
    choice = experiment.tune_learning_rates(CFG, None)
    assert set(choice) == set(ARMS)
    assert {arm for arm, _ in asked} == set(ARMS) - set(experiment.MORE_KD)
    assert choice["vanilla_kd_cm"] == choice["vanilla_kd"] == choice["vanilla_kd_flops"]
    assert choice["align_ti"]["at_edge"] and not choice["sft"]["at_edge"]
    # a preset without vanilla_kd among its arms still gives the compute-matched arm vanilla KD's rate
    only = experiment.tune_learning_rates(dataclasses.replace(CFG, arms=("align_ti", "vanilla_kd_cm")), None)
    assert set(only) == {"align_ti", "vanilla_kd_cm"} and only["vanilla_kd_cm"]["lr"] == pytest.approx(2e-3)


def test_config_refuses_a_grid_that_cannot_be_bracketed():
    with pytest.raises(ValueError, match="lr_grid"):
        dataclasses.replace(SMOKE, lr_grid=(3e-3,))
    with pytest.raises(ValueError, match="lr_grid"):
        dataclasses.replace(SMOKE, lr_grid=(4e-3, 2e-3))
    with pytest.raises(ValueError, match="lr_extend"):
        dataclasses.replace(SMOKE, lr_extend=-1)


# ------------------------------------------------------------------------------------------- what is read
def test_validation_questions_are_disjoint_from_every_presets_test_questions():
    from icml26.registry import get_paper

    paper = get_paper("align_ti")
    for mode, cfg in PRESETS.items():
        val = set(item_ids(experiment.validation_set(cfg).attrs, experiment.validation_set(cfg).items))
        assert len(val) == cfg.n_val
        for seed in paper.modes[mode].seeds:
            test = experiment.build_test_set(cfg, seed, cfg.n_test)
            assert not val & set(item_ids(test.attrs, test.items)), (mode, seed)
        assert val <= experiment.validation_ids(cfg)


def test_the_tuning_and_the_budget_rule_read_validation_questions_and_the_lab_seeds_draws(monkeypatch, tmp_path):
    """``validation_record`` trains on the lab seed's draws (20_000 + lab_seed) and scores the validation set, per
    family; ``stage1_by_family`` scores the stage-1 student on the same validation set."""
    monkeypatch.setenv("ICML26_CACHE", str(tmp_path))
    val = experiment.validation_set(SMOKE)
    want = item_ids(val.attrs, val.items)
    seen = []

    def fake_train(arm, cfg, lr, seed, parts, record=None):
        seen.append(("train", arm, seed))
        return "model", 0.0

    def fake_logits(model, tok, cfg, data, seed):
        seen.append(("teacher", item_ids(data.attrs, data.items)))
        return [(None, None)]

    def fake_evaluate(model, t_logits, tok, cfg, data, seed):
        seen.append(("eval", item_ids(data.attrs, data.items)))
        return {"exact_match": np.array([float(it.family == "patch") for it in data.items])}

    monkeypatch.setattr(experiment, "train_arm", fake_train)
    monkeypatch.setattr(experiment, "_logits_and_batches", fake_logits)
    monkeypatch.setattr(experiment, "evaluate", fake_evaluate)
    rec = experiment.validation_record(SMOKE, "vanilla_kd", 3e-3, ("teacher", "student", "tok", 0))
    assert seen[0] == ("train", "vanilla_kd", 20_000)
    assert [x[1] for x in seen[1:]] == [want, want]
    fams = {it.family for it in val.items}
    assert rec["val_by_family"] == {f: float(f == "patch") for f in fams}
    assert rec["val_accuracy"] == pytest.approx(np.mean([it.family == "patch" for it in val.items]))
    seen.clear()
    start = experiment.stage1_by_family(SMOKE, ("teacher", "student", "tok", 0))
    assert [x[1] for x in seen] == [want, want] and start == rec["val_by_family"]


# ----------------------------------------------------------------------------------------- the budget rule
def test_stage2_budget_rule_by_hand():
    start = {"object": 0.1, "patch": 0.7, "count": 0.2}
    by = {200: {"object": 0.4, "patch": 0.6, "count": 0.3},
          400: {"object": 0.5, "patch": 0.7, "count": 0.3},   # patch ties its start: passes
          800: {"object": 0.6, "patch": 0.8, "count": 0.4}}
    choose = experiment.stage2_budget_choice
    assert choose(start, by, [200, 400, 800]) == {"steps": 400, "met": True}     # the smallest that passes
    assert choose(start, by, [200]) == {"steps": 200, "met": False}             # capped below it
    assert choose(start, {200: by[200]}, [200, 400]) == {"steps": 400, "met": False}  # untrained: not met
    assert choose(start, {**by, 400: {**by[400], "count": 0.19}}, [200, 400, 800]) == {"steps": 800, "met": True}
    with pytest.raises(ValueError, match="affordable"):
        choose(start, by, [])


def test_full_training_estimate_counts_every_arm_seed_and_extra_step():
    full = PRESETS["full"]
    per = dict.fromkeys(full.arms, 0.01) | {"align_ti": 0.03}
    # per seed at 100 steps: 5 arms x 100 x 0.01 + align_ti 100 x 0.03 + 143 x 0.01 + 250 x 0.01
    assert experiment.full_training_estimate(full, per, 2.5, 4, 100) == pytest.approx(4 * (5 + 3 + 1.43 + 2.5))
    assert [experiment.arm_steps(full, a, 200, 2.72) for a in ("kd_tpa", "vanilla_kd_cm", "vanilla_kd_flops")] == [
        200, 286, 544]
    with pytest.raises(KeyError):
        experiment.full_training_estimate(full, {"sft": 0.01}, 2.5, 4, 100)


def test_the_budget_grid_and_the_cap_are_the_registered_ones():
    """README Deviation 13 fixed the grid and the cap before the pilot ran."""
    assert experiment.STAGE2_BUDGETS == (200, 400, 800, 1600)
    assert experiment.STAGE2_TIME_CAP_S == 800.0
    assert HEADLINE == "vs_vanilla_kd"
