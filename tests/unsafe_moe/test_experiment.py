"""The unsafe-routes reproduction: the world, smoke run through the CLI, per-prompt bookkeeping, determinism;
quick run (slow)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("transformers")

from icml26.unsafe_moe.experiment import (
    ARMS,
    BENIGN,
    EVAL_PREFIXES,
    HARMFUL,
    PRESETS,
    TRAIN_PREFIXES,
    keys,
    prompts,
    request_of,
    run,
)

from ..helpers import assert_matches_committed, reproduce_in_subprocess

TINY = dataclasses.replace(PRESETS["smoke"], pretrain_steps=3, align_steps=2, n_eval=2, n_calib=2, n_candidates=2,
                           max_iters=1, rosais_masks=2, cache=False, layers=2, hidden=32, max_new_tokens=6)


def test_world_keeps_evaluation_prefixes_held_out():
    assert not set(TRAIN_PREFIXES) & set(EVAL_PREFIXES)
    items = prompts(EVAL_PREFIXES, HARMFUL)
    assert len(items) == 24 and {request_of(p) for p in items} == set(HARMFUL)
    assert keys(0) == keys(0) and keys(0) != keys(1) and all(len(k) == 4 for k in keys(0).values())
    with pytest.raises(ValueError, match="no known request"):
        request_of("how do i fly.")


def test_smoke_run_through_the_cli(tmp_path):
    data = reproduce_in_subprocess("unsafe_moe", tmp_path, mode="smoke")
    assert {c["id"] for c in data["claims"]} == {"fsour_asr", "vs_random_routes", "rosais_masking",
                                                 "rosais_top_vs_bottom", "defence_lowers_asr",
                                                 "defence_keeps_benign"}
    assert (tmp_path / "unsafe_moe" / "smoke_asr_rosais.png").is_file()
    assert data["arms"]["fsour"]["asr"]["unit"] == "prompts"
    assert data["arms"]["no_attack"]["benign_acc"]["unit"] == "benign_prompts"


@pytest.fixture(scope="module")
def two_families():
    cfg = dataclasses.replace(TINY, families=("mixtral", "olmoe"))
    return cfg, run(cfg)


def test_units_pair_arms_by_family_and_prompt(two_families):
    cfg, out = two_families
    harmful, benign = out.units["prompts"], out.units["benign_prompts"]
    assert set(harmful) == set(ARMS) and set(benign) == {"no_attack", "fsour_defended"}
    n = len(cfg.families) * cfg.n_eval
    assert {len(v) for m in harmful.values() for v in m.values()} == {n}
    assert {len(v) for m in benign.values() for v in m.values()} == {len(cfg.families) * len(EVAL_PREFIXES)
                                                                      * len(BENIGN)}
    assert all(set(m["asr"]) <= {0.0, 1.0} for m in harmful.values())
    for by_arm in out.units.values():
        for arm, metrics in by_arm.items():
            for name, values in metrics.items():
                assert out.metrics[arm][name] == pytest.approx(float(np.mean(values)), rel=1e-12)
    # family-major: the first n_eval outcomes are the first family's, whose mean is its asr_<family>
    for i, family in enumerate(cfg.families):
        block = harmful["fsour"]["asr"][i * cfg.n_eval:(i + 1) * cfg.n_eval]
        assert out.metrics["fsour"][f"asr_{family}"] == pytest.approx(float(np.mean(block)), rel=1e-12)
    # Mixtral renormalises its top-k weights, so sparing default routes leaves its outputs exactly unchanged: the
    # defended model answers the no-attack prompts as the no_attack arm does (first family's block)
    assert cfg.families[0] == "mixtral"
    assert (harmful["fsour_defended"]["no_attack_asr"][: cfg.n_eval] == harmful["no_attack"]["asr"][: cfg.n_eval])
    m = len(EVAL_PREFIXES) * len(BENIGN)
    assert benign["fsour_defended"]["benign_acc"][:m] == benign["no_attack"]["benign_acc"][:m]


def test_same_seed_same_numbers(two_families):
    cfg, out = two_families
    strip = {"search_s"}

    def numbers(metrics):
        return {a: {k: v for k, v in m.items() if k not in strip} for a, m in metrics.items()}

    assert numbers(run(cfg).metrics) == numbers(out.metrics)


def test_bad_config():
    with pytest.raises(ValueError, match="families"):
        run(dataclasses.replace(TINY, families=("llama",)))
    with pytest.raises(ValueError, match="n_eval"):
        run(dataclasses.replace(TINY, n_eval=25))


@pytest.mark.slow
def test_quick_reproduces_the_committed_result(tmp_path):
    data = reproduce_in_subprocess("unsafe_moe", tmp_path, mode="quick")
    # Same CPU: bit-identical except the wall-clock search times. Another CPU: the float32 MoE training and the
    # route search's argmax over candidate log-probs can break near-ties differently, flipping a prompt's outcome;
    # 1/8 is one of a seed's 8 held-out harmful prompts (the mean over 3 seeds moves by 1/24 per flip). RoSais
    # log-prob gains move with the trained weights (0.5 nats), search costs with the searches' paths (25 %).
    tol = {f"{arm}.search_s": 1e6 for arm in ("fsour", "fsour_defended", "random_routes", "rosais_top")}
    tol |= {f"{arm}.aff_gain": 0.5 for arm in ("rosais_top", "rosais_bottom", "rosais_random")}
    assert_matches_committed(data, atol=0.125, rtol=0.0, metrics=tol | {"fsour.forwards": 250.0,
                                                                       "random_routes.forwards": 250.0,
                                                                       "fsour.routes": 10.0})
