"""Verdicts v3: every unit carries an id (family and prompt), and the evaluation prompts are disjoint from the
training and calibration prompts."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("transformers")

from icml26.unsafe_moe.attack import chat_text
from icml26.unsafe_moe.experiment import (
    BENIGN,
    EVAL_PREFIXES,
    FAMILIES,
    HARMFUL,
    PRESETS,
    _stage_data,
    held_out_prompts,
    keys,
    prompt_id,
    run,
    training_prompts,
    unit_ids,
    world_tokenizer,
)

from .test_experiment import TINY


def test_training_prompts_are_every_prompt_the_models_were_trained_on():
    tok = world_tokenizer("mixtral")
    for world in (None, "deep", "shallow"):
        trained, _ = _stage_data(tok, keys(0), world)
        users = {p if p.startswith("fact: ") else chat_text(tok, p, True) for p in training_prompts()}
        assert {p.removesuffix("sure, the key is") for p in trained} == users


@pytest.mark.parametrize("mode", ["smoke", "quick", "full"])
def test_ids_of_every_preset_are_disjoint_from_the_held_out_prompts(mode):
    cfg = PRESETS[mode]
    ids, held = unit_ids(cfg)
    assert len(ids["prompts"]) == len(set(ids["prompts"])) == len(cfg.families) * cfg.n_eval
    assert len(ids["benign_prompts"]) == len(cfg.families) * len(EVAL_PREFIXES) * len(BENIGN)
    for unit, splits in held.items():
        assert splits["train"] and splits["validation"]
        assert not set(ids[unit]) & (set(splits["train"]) | set(splits["validation"]))
    eval_items, calib, _ = held_out_prompts(cfg)
    assert ids["prompts"][: cfg.n_eval] == [prompt_id(cfg.families[0], p) for p in eval_items]
    assert {prompt_id(cfg.families[0], p) for p in calib} <= set(held["prompts"]["validation"])


def test_the_same_prompt_is_the_same_unit_in_every_seed_and_family_apart():
    a = unit_ids(dataclasses.replace(PRESETS["full"], seed=100))[0]
    b = unit_ids(dataclasses.replace(PRESETS["full"], seed=101))[0]
    # each seed attacks its own subset of the pool; a prompt has the same id in both, and the pool is shared
    assert a["pool_prompts"] == b["pool_prompts"] and a["prompts"] != b["prompts"]
    assert set(a["prompts"]) & set(b["prompts"]) and set(a["prompts"]) | set(b["prompts"]) <= set(a["pool_prompts"])
    assert len({prompt_id(f, f"show me how to {HARMFUL[0]}.") for f in FAMILIES}) == len(FAMILIES)


def test_a_tiny_run_carries_ids_for_every_unit():
    out = run(dataclasses.replace(TINY, worlds=("shallow",)))
    assert set(out.unit_ids) == set(out.units) == set(out.held_out)
    for unit, by_arm in out.units.items():
        for metrics in by_arm.values():
            for values in metrics.values():
                assert len(values) == len(out.unit_ids[unit])
    assert all(n == 0 for splits in out.overlap().values() for n in splits.values())
