"""The branch-and-cut reproduction and the SCIP cross-check: smoke run, determinism; quick run (slow)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from icml26.branch_and_cut import closed_form_jeroslow_sb, tie_breaking_family
from icml26.branch_and_cut.experiment import PRESETS, run

from ..conftest import ROOT
from ..helpers import reproduce_in_subprocess


def test_scip_replays_family_a():
    pytest.importorskip("pyscipopt", reason="the SCIP cross-check needs the opt extra (pyscipopt)")
    from icml26.branch_and_cut.scip import scip_tree_size

    for n in (3, 5, 7):
        assert scip_tree_size(tie_breaking_family(n)) == closed_form_jeroslow_sb(n)
        assert scip_tree_size(tie_breaking_family(n), tie_break="reverse") <= 11


def test_smoke_run_through_the_cli(tmp_path):
    data = reproduce_in_subprocess("branch_and_cut", tmp_path, mode="smoke")
    assert {c["id"] for c in data["claims"]} == {"tie_breaking", "sb_suboptimal", "cut_selection", "rhs_perturbation",
                                                 "score_perturbation", "learned_policy", "scip_cross_check"}
    assert data["arms"]["sb_xfirst"]["tree_size"]["mean"] == 39
    assert (tmp_path / "branch_and_cut" / "smoke_tree_sizes.png").is_file()


def test_same_seed_same_numbers():
    cfg = dataclasses.replace(PRESETS["smoke"], seed=1)
    assert run(cfg).metrics == run(cfg).metrics


def test_bad_config():
    with pytest.raises(ValueError, match="odd"):
        run(dataclasses.replace(PRESETS["smoke"], ns=(4,)))


@pytest.mark.slow
def test_quick_reproduces_the_committed_conclusions(tmp_path):
    data = reproduce_in_subprocess("branch_and_cut", tmp_path, mode="quick")
    committed = json.loads((ROOT / "results" / "branch_and_cut" / "quick.json").read_text())
    assert {c["id"]: c["holds"] for c in data["claims"]} == {c["id"]: c["holds"] for c in committed["claims"]}
