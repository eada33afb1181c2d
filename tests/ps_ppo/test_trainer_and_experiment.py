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
    with pytest.raises(ValueError, match=r"beta=0\.0"):
        PSGRPOTrainer("unused", reward_funcs=lambda **kw: [0.0], args=cfg)
    with pytest.raises(ValueError, match="cutoff must be"):
        cutoff_law("poisson")


def test_smoke_run_through_the_cli(tmp_path):
    data = reproduce_in_subprocess("ps_ppo", tmp_path, mode="smoke")
    assert {c["id"] for c in data["claims"]} == {"accuracy", "update_compute", "peak_memory", "unbiased"}
    assert data["arms"]["grpo"]["kept_completion_fraction"]["mean"] == 1.0
    assert data["arms"]["grpo"]["update_tokens"]["unit"] == "updates"
    assert (tmp_path / "ps_ppo" / "smoke_accuracy_vs_tokens.png").is_file()


@pytest.fixture(scope="module")
def tiny_run():
    cfg = dataclasses.replace(PRESETS["smoke"], iterations=2, eval_prompts=8, unbiased_draws=(10, 20),
                              unbiased_replications=3)
    return cfg, run(cfg)


def test_units_pair_across_arms_and_average_to_the_metrics(tiny_run):
    cfg, out = tiny_run
    prompts, updates, reps = out.units["prompts"], out.units["updates"], out.units["replications"]
    assert set(prompts) == set(updates) == set(ARMS) and set(reps) == {"ps_ppo"}
    assert {len(m["accuracy"]) for m in prompts.values()} == {cfg.eval_prompts}
    assert all(set(m["accuracy"]) <= {0.0, 1.0} for m in prompts.values())
    assert {len(v) for m in updates.values() for v in m.values()} == {cfg.iterations}
    assert {len(v) for v in reps["ps_ppo"].values()} == {cfg.unbiased_replications}
    for by_arm in out.units.values():
        for arm, metrics in by_arm.items():
            for name, values in metrics.items():
                assert out.metrics[arm][name] == pytest.approx(float(np.mean(values)), rel=1e-12)
    # GRPO keeps every completion token; a prefix arm keeps fewer token positions on every update
    assert updates["grpo"]["kept_completion_fraction"] == [1.0] * cfg.iterations
    assert all(p < g for p, g in zip(updates["ps_ppo"]["update_tokens"], updates["grpo"]["update_tokens"],
                                     strict=True))
    # independent sequences of cutoff draws give different slopes
    assert len(set(reps["ps_ppo"]["grad_error_slope"])) == cfg.unbiased_replications


def test_same_seed_same_numbers(tiny_run):
    cfg, out = tiny_run
    strip = lambda m: {a: {k: v for k, v in ms.items() if k != "update_cpu_ms"} for a, ms in m.items()}  # noqa: E731
    assert strip(run(cfg).metrics) == strip(out.metrics)


def test_bad_config():
    with pytest.raises(ValueError, match="unbiased_replications"):
        run(dataclasses.replace(PRESETS["smoke"], unbiased_replications=0))


@pytest.mark.slow
def test_quick_reproduces_the_committed_result(tmp_path):
    data = reproduce_in_subprocess("ps_ppo", tmp_path, mode="quick")
    # Same CPU: bit-identical except the CPU time. Another CPU: float32 SFT and RL updates sum in a different
    # order (SIMD width, BLAS kernels), which can flip a few sampled rollouts and greedy answers; 0.05 is 30 of
    # the 600 held-out prompts. update_cpu_ms is a timing (machine- and load-dependent) and is not compared.
    # Token positions and activation bytes follow from the rollouts' lengths (about 5 %).
    tol = {f"{arm}.update_cpu_ms": 1e6 for arm in ARMS}
    tol |= {f"{arm}.update_tokens": 50.0 for arm in ARMS} | {f"{arm}.peak_activation_mb": 0.25 for arm in ARMS}
    assert_matches_committed(data, atol=0.05, metrics=tol)
