"""Verdicts v3: every unit carries an id, and the test questions are disjoint from every question the teacher and
the student trained on and from the validation and calibration questions."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from icml26.align_ti import experiment
from icml26.align_ti.experiment import (
    PRESETS,
    build_test_set,
    lab_training_ids,
    recording_sampler,
    stream_ids,
    student_recipe,
    teacher_recipe,
    unit_ids_of,
)
from icml26.common import tiny_vlm

SMOKE = PRESETS["smoke"]


def test_a_tiny_run_carries_ids_for_every_unit_and_no_test_question_was_trained_on():
    cfg = dataclasses.replace(SMOKE, arms=("sft",), seed=3)
    run = experiment.run(cfg)
    assert set(run.unit_ids) == set(run.units) == set(run.held_out) == {"items", "long"}
    for unit, by_arm in run.units.items():
        for metrics in by_arm.values():
            for values in metrics.values():
                assert len(values) == len(run.unit_ids[unit])
    train = set(run.held_out["items"]["train"])
    assert lab_training_ids(cfg) <= train and len(train) > len(lab_training_ids(cfg))  # + distillation
    assert len(run.held_out["items"]["validation"]) == cfg.n_val + 2 * cfg.n_irs_pairs
    assert all(n == 0 for splits in run.overlap().values() for n in splits.values())
    other = unit_ids_of(build_test_set(cfg, cfg.seed + 1, cfg.n_test))
    assert not set(other["items"]) & set(run.unit_ids["items"])  # each seed draws fresh scenes


def test_replayed_streams_are_the_sampled_ones():
    scenes, tok = tiny_vlm.SceneSpec(grid=SMOKE.grid), tiny_vlm.vlm_tokenizer()
    record: set[str] = set()
    plain = tiny_vlm.instruction_sampler(tok, scenes, SMOKE.families, 8)
    recording = recording_sampler(tok, scenes, SMOKE.families, 8, record)
    rng_a, rng_b = np.random.default_rng(7), np.random.default_rng(7)
    for _ in range(3):
        a, b = plain(rng_a), recording(rng_b)
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert record == stream_ids(scenes, SMOKE.families, 8, 7, 3)


def test_lab_training_ids_cover_the_lab_stages(monkeypatch):
    """The lab's stage 1 and stage 2 streams (seeds, steps, families) are the ones ``lab_training_ids`` replays."""
    calls = []

    def fake_train(model, sample, *, steps, seed, **kw):
        calls.append((sample, steps, seed))
        return model

    def fake_encoder(recipe, cache=True):
        return tiny_vlm.tiny_vlm(tiny_vlm.vlm_tokenizer(), recipe.spec, recipe.scenes).model.vision_tower.state_dict()

    monkeypatch.setattr(tiny_vlm, "train_vlm", fake_train)
    monkeypatch.setattr(tiny_vlm, "encoder_for", fake_encoder)
    known = lab_training_ids(SMOKE)
    tok = tiny_vlm.vlm_tokenizer()
    for recipe in (teacher_recipe(SMOKE), student_recipe(SMOKE)):
        calls.clear()
        tiny_vlm.lab_vlm(recipe, cache=False, desc=None)
        assert [(steps, seed) for _, steps, seed in calls] == [
            (recipe.stage1_steps, recipe.seed + 1), *([(recipe.stage2_steps, recipe.seed + 2)] * bool(recipe.stage2_steps))]
        for (sample, _, seed), families in zip(calls, (recipe.stage1_families, recipe.stage2_families), strict=False):
            record: set[str] = set()
            mine = recording_sampler(tok, recipe.scenes, families, recipe.batch_size, record)
            rng_a, rng_b = np.random.default_rng(seed), np.random.default_rng(seed)
            for _ in range(2):
                a, b = sample(rng_a), mine(rng_b)
                assert all(torch.equal(a[k], b[k]) for k in a)
            assert record <= known
