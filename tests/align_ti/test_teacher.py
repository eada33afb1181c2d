"""README Deviation 17 (issue #54 item 1): the teacher's own stage-1 and stage-2 learning rates, chosen by the
teacher pilot (``scripts/align_ti_teacher_pilot.py``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from icml26.align_ti.experiment import PRESETS


def test_the_teacher_takes_its_own_learning_rates_and_the_student_keeps_the_labs():
    """README Deviation 17: the teacher's stage-1 and stage-2 rates are the teacher pilot's; the student's stage 1
    keeps the lab's rate (it is the start every arm shares)."""
    from icml26.align_ti.experiment import TEACHER_LR, student_recipe, teacher_recipe
    from icml26.common.tiny_vlm import LabRecipe

    cfg = dataclasses.replace(PRESETS["smoke"], teacher_stage1_lr=1.25e-3, teacher_stage2_lr=7e-4)
    rec = teacher_recipe(cfg)
    assert (rec.stage1_lr, rec.stage2_lr) == (1.25e-3, 7e-4)
    assert student_recipe(cfg).stage1_lr == LabRecipe().stage1_lr
    for mode in ("quick", "full"):
        rec = teacher_recipe(PRESETS[mode])
        assert (rec.stage1_lr, rec.stage2_lr) == TEACHER_LR
    # the committed pilot's choice is the presets' rates
    chosen = json.loads((Path(__file__).resolve().parents[2] / "results/align_ti/teacher_pilot.json").read_text())
    assert (chosen["stage1_lr"], chosen["stage2_lr"]) == TEACHER_LR and not chosen["at_edge"]
    for bad in (0.0, -1e-3, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match="teacher_stage1_lr"):
            dataclasses.replace(PRESETS["smoke"], teacher_stage1_lr=bad)
        with pytest.raises(ValueError, match="teacher_stage2_lr"):
            dataclasses.replace(PRESETS["smoke"], teacher_stage2_lr=bad)


def test_the_presets_stage2_budget_is_the_committed_stage2_pilots_choice_on_this_teacher():
    """README Deviation 13's rule, rerun on Deviation 17's teacher: the committed pilot ran on the presets' teacher
    (its recipe carries the teacher's rates) and chose the presets' budget."""
    pilot = json.loads((Path(__file__).resolve().parents[2] / "results/align_ti/stage2_pilot.json").read_text())
    assert pilot["steps"] == PRESETS["quick"].steps == PRESETS["full"].steps
    assert pilot["src_clean"]
