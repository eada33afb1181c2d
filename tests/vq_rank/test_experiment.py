"""The VQ-rank reproduction: smoke run through the CLI, determinism; quick run (slow)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from icml26.vq_rank.experiment import PRESETS, run

from ..conftest import ROOT
from ..helpers import reproduce_in_subprocess


def test_smoke_run_through_the_cli(tmp_path):
    data = reproduce_in_subprocess("vq_rank", tmp_path, mode="smoke")
    assert {c["id"] for c in data["claims"]} == {"collapse", "rank_restored", "fidelity"}
    assert data["arms"]["fsq"]["used_codes"]["mean"] <= 256
    assert (tmp_path / "vq_rank" / "smoke_mse_vs_erank.png").is_file()


def test_same_seed_same_numbers():
    cfg = dataclasses.replace(PRESETS["smoke"], steps=20, prior_steps=5, arms=("vq", "simvq_cr"))
    assert run(cfg).metrics == run(cfg).metrics


def test_regime_search_runs():
    cfg = dataclasses.replace(PRESETS["smoke"], steps=10, prior_steps=5, arms=("simvq",),
                              regimes=("late_small_lambda", "cosine"))
    metrics = run(cfg).metrics["regime_search"]
    assert set(metrics) == {"late_small_lambda_mse_delta", "late_small_lambda_mse_plain", "cosine_mse_delta",
                            "cosine_mse_plain"}


@pytest.mark.slow
def test_quick_reproduces_the_committed_conclusions(tmp_path):
    data = reproduce_in_subprocess("vq_rank", tmp_path, mode="quick")
    committed = json.loads((ROOT / "results" / "vq_rank" / "quick.json").read_text())
    assert {c["id"]: c["holds"] for c in data["claims"]} == {c["id"]: c["holds"] for c in committed["claims"]}
