"""Verdicts v3: every unit carries an id, and the test questions are disjoint from the trained and validated ones."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from icml26.common.results import SeedRun
from icml26.common.tiny_vlm import SceneSpec, instruction_sampler, vlm_tokenizer
from icml26.moda import experiment
from icml26.moda.experiment import PRESETS, build_test_set, held_out_of, item_ids, unit_ids_of

TINY = dataclasses.replace(PRESETS["smoke"], steps=2, n_val=8, n_test=16, n_pairs=4, arms=("none", "moda"),
                           depths=(), seed=3)


def test_a_tiny_run_carries_ids_for_every_unit_and_no_test_question_was_trained_on():
    run = experiment.run(TINY)
    assert set(run.unit_ids) == set(run.units) == set(run.held_out)
    for unit, by_arm in run.units.items():
        for metrics in by_arm.values():
            for values in metrics.values():
                assert len(values) == len(run.unit_ids[unit])
    assert len(run.held_out["items"]["train"]) >= TINY.steps * TINY.batch_size  # stage 2 (and the probe)
    assert len(run.held_out["items"]["validation"]) == TINY.n_val
    assert all(n == 0 for splits in run.overlap().values() for n in splits.values())
    # the next seed draws other scenes: other ids
    other = unit_ids_of(build_test_set(TINY, TINY.seed + 1, TINY.n_test, TINY.n_pairs))
    assert not set(other["items"]) & set(run.unit_ids["items"])
    assert not set(other["pairs"]) & set(run.unit_ids["pairs"])


def test_recorded_training_ids_are_the_training_stream():
    scenes, tok = SceneSpec(grid=TINY.grid), vlm_tokenizer()
    plain = instruction_sampler(tok, scenes, "attribute", 8)
    record: set[str] = set()
    recording = experiment._recording_sampler(tok, scenes, 8, record)
    rng_a, rng_b, rng_c = (np.random.default_rng(5) for _ in range(3))
    for _ in range(3):
        a, b = plain(rng_a), recording(rng_b)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    from icml26.common.tiny_vlm import make_items, sample_scenes

    expected = set()
    for _ in range(3):
        attrs = sample_scenes(scenes, rng_c, 8)
        expected |= set(item_ids(attrs, make_items(scenes, attrs, rng_c, "attribute")))
        experiment.render(scenes, attrs, rng_c)
    assert record == expected


def test_a_test_question_among_the_trained_ones_is_a_leak():
    data = build_test_set(TINY, 0, 12, 3)
    ids = unit_ids_of(data)
    assert len(set(ids["items"])) == 12 and len(set(ids["pairs"])) == 3
    member = item_ids(data.pair_attrs, data.pair_items)[1]  # the twin scene of the first pair
    held = held_out_of(data, {ids["items"][0], member}, set())
    run = SeedRun({"a": {}}, units={"items": {"a": {"acc": [1.0] * 12}},
                                    "entangled": {"a": {"ent": [1.0] * len(ids["entangled"])}},
                                    "pairs": {"a": {"pair": [1.0] * 3}}}, unit_ids=ids, held_out=held)
    assert run.overlap()["items"]["train"] == 1
    assert run.overlap()["pairs"]["train"] == 1
    assert run.overlap()["items"]["validation"] == 0
