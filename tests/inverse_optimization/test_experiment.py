"""The inverse-optimisation reproduction: smoke run through the CLI, determinism; quick run (slow)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from icml26.inverse_optimization.experiment import PRESETS, run

from ..conftest import ROOT
from ..helpers import reproduce_in_subprocess


def test_smoke_run_through_the_cli(tmp_path):
    data = reproduce_in_subprocess("inverse_optimization", tmp_path, mode="smoke")
    assert {c["id"] for c in data["claims"]} == {"finite_regret", "vs_ons", "vs_ogd", "mistake_bound",
                                                 "early_corruption", "random_corruption"}
    for name in ("regret", "mistakes", "corruption"):
        assert (tmp_path / "inverse_optimization" / f"smoke_{name}.png").is_file()


def test_same_seed_same_numbers():
    cfg = dataclasses.replace(PRESETS["smoke"], T=150)
    assert run(cfg).metrics == run(cfg).metrics


@pytest.mark.slow
def test_quick_reproduces_the_committed_conclusions(tmp_path):
    data = reproduce_in_subprocess("inverse_optimization", tmp_path, mode="quick")
    committed = json.loads((ROOT / "results" / "inverse_optimization" / "quick.json").read_text())
    assert {c["id"]: c["holds"] for c in data["claims"]} == {c["id"]: c["holds"] for c in committed["claims"]}
