"""The FedIT reproduction: smoke run through the CLI, determinism; quick run (slow)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from icml26.fedit.experiment import PRESETS, run

from ..conftest import ROOT
from ..helpers import reproduce_in_subprocess


def test_smoke_run_through_the_cli(tmp_path):
    data = reproduce_in_subprocess("fedit", tmp_path, mode="smoke")
    assert {c["id"] for c in data["claims"]} >= {"validity", "pooled_invalid", "private_validity"}
    assert (tmp_path / "fedit" / "smoke_level_and_power.png").is_file()


def test_same_seed_same_numbers():
    cfg = dataclasses.replace(PRESETS["smoke"], h0_reps=2, h1_reps=2, perm_reps=1, dp_reps=1, n_permutations=10)
    assert run(cfg).metrics == run(cfg).metrics


@pytest.mark.slow
def test_quick_reproduces_the_committed_conclusions(tmp_path):
    data = reproduce_in_subprocess("fedit", tmp_path, mode="quick")
    committed = json.loads((ROOT / "results" / "fedit" / "quick.json").read_text())
    assert {c["id"]: c["holds"] for c in data["claims"]} == {c["id"]: c["holds"] for c in committed["claims"]}
