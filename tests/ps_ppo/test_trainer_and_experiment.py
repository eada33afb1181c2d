"""PSGRPOTrainer's configuration errors; the PS-PPO reproduction's smoke run, determinism; quick run (slow)."""

from __future__ import annotations

import dataclasses
import json

import pytest

pytest.importorskip("trl")

from icml26.ps_ppo.experiment import PRESETS, run

from ..conftest import ROOT
from ..helpers import reproduce_in_subprocess


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
    assert (tmp_path / "ps_ppo" / "smoke_accuracy_vs_tokens.png").is_file()


def test_same_seed_same_numbers():
    cfg = dataclasses.replace(PRESETS["smoke"], iterations=1, eval_prompts=8, unbiased_draws=(10, 20))
    strip = lambda m: {a: {k: v for k, v in ms.items() if k != "update_cpu_ms"} for a, ms in m.items()}  # noqa: E731
    assert strip(run(cfg).metrics) == strip(run(cfg).metrics)


@pytest.mark.slow
def test_quick_reproduces_the_committed_conclusions(tmp_path):
    data = reproduce_in_subprocess("ps_ppo", tmp_path, mode="quick")
    committed = json.loads((ROOT / "results" / "ps_ppo" / "quick.json").read_text())
    assert {c["id"]: c["holds"] for c in data["claims"]} == {c["id"]: c["holds"] for c in committed["claims"]}
