"""PSGRPOTrainer's configuration errors; the PS-PPO reproduction's smoke run, per-unit bookkeeping, determinism;
quick run (slow)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("trl")

from icml26.ps_ppo.experiment import ARMS, PRESETS, run

from ..helpers import assert_matches_committed, reproduce_in_subprocess


def test_trainer_config_errors(tmp_path):
    from icml26.ps_ppo.trainer import PSGRPOConfig, PSGRPOTrainer, cutoff_law

    with pytest.raises(TypeError, match="PSGRPOConfig"):
        PSGRPOTrainer("unused", reward_funcs=lambda **kw: [0.0], args=None)
    cfg = PSGRPOConfig(output_dir=str(tmp_path), beta=0.1, use_cpu=True, report_to="none")
    assert cfg.loss_type == "dr_grpo"
    # micro-batching is on by default, with the reproduction's (and the benchmark's default row's) count
    assert cfg.ps_micro_batches == PRESETS["quick"].micro_batches == PRESETS["full"].micro_batches == 4
    with pytest.raises(ValueError, match=r"beta=0\.0"):
        PSGRPOTrainer("unused", reward_funcs=lambda **kw: [0.0], args=cfg)
    with pytest.raises(ValueError, match="cutoff must be"):
        cutoff_law("poisson")
    assert type(cutoff_law("full_mixed", mix=0.25, stratified=True)).__name__ == "StratifiedCutoff"


def test_smoke_run_through_the_cli(tmp_path):
    data = reproduce_in_subprocess("ps_ppo", tmp_path, mode="smoke")
    assert {c["id"] for c in data["claims"]} == {
        "accuracy_at_half_tokens_prompt_conditioned",
        "accuracy_equivalence_prompt_conditioned",
        "accuracy_at_half_tokens",
        "accuracy_equivalence",
        "accuracy_equivalence_mixed",
        "update_compute",
        "update_cpu",
        "peak_memory",
        "rl_room",
        "unbiased",
    }
    assert data["headline"]["id"] == "accuracy_at_half_tokens_prompt_conditioned"
    assert data["arms"]["grpo"]["kept_completion_fraction"]["mean"] == 1.0
    # the chosen learning rates are in the result; smoke's one-rate grid is noted as not bracketed
    assert data["arms"]["ps_ppo_adaptive"]["lr"]["values"] == [1e-4]
    assert data["arms"]["ps_ppo_adaptive"]["lr_at_grid_edge"]["values"] == [1.0]
    head = next(c for c in data["claims"] if c["id"] == "accuracy_at_half_tokens_prompt_conditioned")
    assert any("not bracketed" in n for n in head["notes"])
    assert data["arms"]["grpo"]["update_tokens"]["unit"] == "updates"
    assert (tmp_path / "ps_ppo" / "smoke_accuracy_vs_tokens.png").is_file()


@pytest.fixture(scope="module")
def tiny_run():
    cfg = dataclasses.replace(
        PRESETS["smoke"],
        iterations=1,
        eval_prompts=8,
        val_prompts=4,
        lrs=(1e-4, 3e-4),
        unbiased_draws=(10, 20),
        unbiased_replications=3,
        arms=("grpo", "ps_ppo", "ps_ppo_mixed", "ps_ppo_adaptive", "ps_ppo_unweighted"),
    )
    return cfg, run(cfg)


def test_units_pair_across_arms_and_average_to_the_metrics(tiny_run):
    cfg, out = tiny_run
    prompts, updates, reps = out.units["prompts"], out.units["updates"], out.units["replications"]
    assert set(prompts) == {"sft", *cfg.arms} and set(updates) == set(cfg.arms) and set(reps) == {"ps_ppo"}
    assert set(out.series["chosen_lr"]) == set(updates) and set(out.series["chosen_lr"].values()) <= set(
        cfg.lrs
    )
    assert {a for a, m in prompts.items() if "accuracy_at_budget" in m} == {
        "ps_ppo",
        "ps_ppo_mixed",
        "ps_ppo_adaptive",
        "ps_ppo_unweighted",
    }
    # the chosen rate and its grid are in the metrics; a two-rate grid without extensions leaves it on an edge
    for arm in cfg.arms:
        m = out.metrics[arm]
        assert m["lr"] == out.series["chosen_lr"][arm] and (m["lr_grid_low"], m["lr_grid_high"]) == cfg.lrs
        assert m["lr_at_grid_edge"] == 1.0
    assert "not bracketed" in out.notes["accuracy_at_half_tokens_prompt_conditioned"]
    assert {len(v) for m in prompts.values() for v in m.values()} == {cfg.eval_prompts}
    assert all(set(v) <= {0.0, 1.0} for m in prompts.values() for v in m.values())
    assert {len(v) for m in updates.values() for v in m.values()} == {cfg.iterations}
    assert {len(v) for v in reps["ps_ppo"].values()} == {cfg.unbiased_replications}
    for by_arm in out.units.values():
        for arm, metrics in by_arm.items():
            for name, values in metrics.items():
                assert out.metrics[arm][name] == pytest.approx(float(np.mean(values)), rel=1e-12)
    # GRPO keeps every completion token; a prefix arm keeps fewer token positions on every update
    assert updates["grpo"]["kept_completion_fraction"] == [1.0] * cfg.iterations
    assert all(
        p < g
        for p, g in zip(updates["ps_ppo"]["update_tokens"], updates["grpo"]["update_tokens"], strict=True)
    )
    # two PPO epochs: the second epoch's ratios move, so the clip can act
    assert all(0.0 <= c <= 1.0 for m in updates.values() for c in m["clip_fraction"])
    # independent sequences of cutoff draws give different slopes
    assert len(set(reps["ps_ppo"]["grad_error_slope"])) == cfg.unbiased_replications


def test_same_seed_same_numbers(tiny_run):
    cfg, out = tiny_run
    strip = lambda m: {a: {k: v for k, v in ms.items() if k != "update_cpu_ms"} for a, ms in m.items()}  # noqa: E731
    assert strip(run(cfg).metrics) == strip(out.metrics)


def test_bad_config():
    with pytest.raises(ValueError, match="unbiased_replications"):
        run(dataclasses.replace(PRESETS["smoke"], unbiased_replications=0))
    with pytest.raises(ValueError, match="lrs"):
        run(dataclasses.replace(PRESETS["smoke"], lrs=()))
    with pytest.raises(ValueError, match="arms"):
        run(dataclasses.replace(PRESETS["smoke"], arms=("ps_ppo", "grpo")))
    with pytest.raises(ValueError, match="budget"):
        run(dataclasses.replace(PRESETS["smoke"], budget=1.5))
    with pytest.raises(ValueError, match="lr_tuning_seed"):
        run(dataclasses.replace(PRESETS["smoke"], seed=4, lr_tuning_seed=4))


@pytest.mark.slow
def test_quick_reproduces_the_committed_result(tmp_path):
    data = reproduce_in_subprocess("ps_ppo", tmp_path, mode="quick")
    # Same CPU: bit-identical except the CPU time. Another CPU: float32 SFT and RL updates sum in a different
    # order (SIMD width, BLAS kernels), which can flip a few sampled rollouts and greedy answers; 0.05 is 30 of
    # the 600 held-out prompts. update_cpu_ms is a timing (machine- and load-dependent) and is not compared.
    # Token positions and activation bytes follow from the rollouts' lengths (about 5 %).
    # With two learning rates per arm a flipped validation tie can change an arm's chosen learning rate; the
    # verdicts are compared exactly. Positions: about 5 % of an update's ~4,000.
    tol = {f"{arm}.update_cpu_ms": 1e6 for arm in ARMS}
    tol |= {f"{arm}.update_tokens": 200.0 for arm in ARMS} | {
        f"{arm}.peak_activation_mb": 0.25 for arm in ARMS
    }
    tol |= {f"{arm}.saved_activation_mb": 1.0 for arm in ARMS}
    assert_matches_committed(data, atol=0.05, metrics=tol)
