"""The RePO reproduction: smoke run through the CLI, determinism; quick run (slow)."""

from __future__ import annotations

import dataclasses
import json

import pytest

pytest.importorskip("transformers")

from icml26.regret_po.experiment import PRESETS, lab_models, preference_data, run

from ..conftest import ROOT
from ..helpers import reproduce_in_subprocess


def test_smoke_run_through_the_cli(tmp_path):
    data = reproduce_in_subprocess("regret_po", tmp_path, mode="smoke")
    assert {c["id"] for c in data["claims"]} == {"regret_labels", "deterministic_variant", "vs_rpo",
                                                 "behaviour_matters"}
    assert (tmp_path / "regret_po" / "smoke_accuracy_vs_steps.png").is_file()


def test_pairs_are_labelled_by_regret_and_carry_behaviour_logps():
    cfg = PRESETS["smoke"]
    tok, _, mu_s, mu_w = lab_models(cfg)
    data = preference_data(cfg, tok, mu_s, mu_w, 40, seed=3)
    assert data["prompt"] and len(data["b_chosen"]) == len(data["chosen"])
    for c, b in zip(data["chosen"], data["b_chosen"], strict=True):
        assert len(b) == len(tok(c, add_special_tokens=False)["input_ids"]) + 1 and all(v <= 0 for v in b)


def test_same_seed_same_numbers():
    cfg = dataclasses.replace(PRESETS["smoke"], n_pairs=24, steps=2, eval_prompts=10, eval_every=0)
    assert run(cfg).metrics == run(cfg).metrics


@pytest.mark.slow
def test_quick_reproduces_the_committed_conclusions(tmp_path):
    data = reproduce_in_subprocess("regret_po", tmp_path, mode="quick")
    committed = json.loads((ROOT / "results" / "regret_po" / "quick.json").read_text())
    assert {c["id"]: c["holds"] for c in data["claims"]} == {c["id"]: c["holds"] for c in committed["claims"]}
