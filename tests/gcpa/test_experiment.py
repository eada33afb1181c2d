"""The GCPA reproduction: smoke run through the CLI, determinism; quick run (slow)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from icml26.gcpa.experiment import PRESETS, run

from ..conftest import ROOT
from ..helpers import reproduce_in_subprocess


def test_smoke_run_through_the_cli(tmp_path):
    data = reproduce_in_subprocess("gcpa", tmp_path, mode="smoke")
    assert {c["id"] for c in data["claims"]} >= {"gcpa_vs_gpa", "gcpa_vs_cca", "text_gcpa_vs_gpa"}
    assert set(data["arms"]) == {"pairwise_procrustes", "pairwise_cca", "gpa", "gcca", "mcca_sumcor", "gcpa",
                                 "gcpa_weak"}
    assert data["arms"]["gpa"]["digits_distortion"]["mean"] == pytest.approx(0.0, abs=1e-12)
    assert data["arms"]["pairwise_procrustes"]["digits_maps"]["mean"] == 20.0
    assert (tmp_path / "gcpa" / "smoke_retrieval_vs_distortion.png").is_file()


def test_same_seed_same_numbers():
    cfg = dataclasses.replace(PRESETS["smoke"], datasets=("digits",), digits_steps=20)
    strip = lambda m: {a: {k: v for k, v in ms.items() if "seconds" not in k} for a, ms in m.items()}  # noqa: E731
    assert strip(run(cfg).metrics) == strip(run(cfg).metrics)


def test_unknown_dataset():
    with pytest.raises(ValueError, match="datasets must be among"):
        run(dataclasses.replace(PRESETS["smoke"], datasets=("images",)))


@pytest.mark.slow
def test_quick_reproduces_the_committed_conclusions(tmp_path):
    data = reproduce_in_subprocess("gcpa", tmp_path, mode="quick")
    committed = json.loads((ROOT / "results" / "gcpa" / "quick.json").read_text())
    assert {c["id"]: c["holds"] for c in data["claims"]} == {c["id"]: c["holds"] for c in committed["claims"]}
