"""Verdicts v3: every unit carries an id, and the test prompts are disjoint from the trained and validated ones."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("transformers")

from icml26.common.tiny_lm import AdditionChain
from icml26.ps_ppo import experiment
from icml26.ps_ppo.experiment import (
    PRESETS,
    prompt_id,
    prompt_sets,
    replication_seeds,
    rl_prompts,
    run,
    unit_ids,
)

TASK = AdditionChain(7, 9)


def test_a_tiny_run_carries_ids_for_every_unit_and_no_test_prompt_was_trained_on():
    cfg = dataclasses.replace(PRESETS["smoke"], iterations=1, eval_prompts=8, val_prompts=4, lrs=(1e-4,),
                              unbiased_draws=(10, 20), unbiased_replications=2, arms=("grpo", "ps_ppo"))
    out = run(cfg)
    assert set(out.unit_ids) == set(out.units) == {"prompts", "updates", "replications"}
    for unit, by_arm in out.units.items():
        for metrics in by_arm.values():
            for values in metrics.values():
                assert len(values) == len(out.unit_ids[unit])
    assert set(out.held_out) == {"prompts"}
    assert len(out.held_out["prompts"]["train"]) >= experiment.SFT_EXAMPLES - 10  # SFT chains (+ RL), distinct
    assert all(n == 0 for splits in out.overlap().values() for n in splits.values())


@pytest.mark.parametrize("mode", ["quick", "full"])
def test_every_seed_of_the_presets_keeps_its_test_prompts_held_out(mode):
    from icml26.registry import get_paper

    for seed in get_paper("ps_ppo").modes[mode].seeds:
        cfg = dataclasses.replace(PRESETS[mode], seed=seed)
        sets = prompt_sets(cfg, TASK)
        ids, held = unit_ids(cfg, TASK, sets)
        assert len(ids["prompts"]) == cfg.eval_prompts and len(ids["updates"]) == cfg.iterations
        assert len(ids["replications"]) == len(set(ids["replications"])) == cfg.unbiased_replications
        assert not set(ids["prompts"]) & (set(held["prompts"]["train"]) | set(held["prompts"]["validation"]))


def test_test_prompts_skip_trained_chains_and_the_rl_stream_is_the_trainers(monkeypatch):
    cfg = dataclasses.replace(PRESETS["smoke"], iterations=3, eval_prompts=40, seed=5)
    sets = prompt_sets(cfg, TASK)
    # the RL prompts are the seed's stream, iteration by iteration (what _train read from its own generator)
    rng = np.random.default_rng(60_000 + cfg.seed)
    assert sets.rl == [[TASK.sample(rng).prompt for _ in range(cfg.prompts_per_iteration)] for _ in range(3)]
    assert rl_prompts(cfg, TASK) == sets.rl
    # force collisions: with the test stream's own first draws among the trained chains, they are skipped
    rng = np.random.default_rng(50_000 + cfg.seed)
    first = [TASK.sample(rng).prompt for _ in range(5)]
    monkeypatch.setattr(experiment, "rl_prompts", lambda c, t: [first[:3], *rl_prompts(c, t)[1:]])
    forced = prompt_sets(cfg, TASK)
    assert forced.test[:2] == first[3:5] and not set(first[:3]) & set(forced.test)
    assert len(forced.test) == cfg.eval_prompts
    assert prompt_id(first[0]) != prompt_id(first[1]) and len(replication_seeds(cfg)) == cfg.unbiased_replications
