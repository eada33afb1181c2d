"""The inverse-optimisation reproduction: smoke run through the CLI, determinism; quick run (slow)."""

from __future__ import annotations

import dataclasses

import pytest

from icml26.inverse_optimization.experiment import PRESETS, run

from ..helpers import assert_matches_committed, reproduce_in_subprocess


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
def test_quick_reproduces_the_committed_result(tmp_path):
    data = reproduce_in_subprocess("inverse_optimization", tmp_path, mode="quick")
    # Everything is float64 NumPy with seeded generators: mistakes and restarts are counts and must match exactly
    # in practice; another CPU's BLAS may sum ONS's and OGD's matrix products in another order and change the
    # last bits of their iterates and of the regrets, but the decisions (argmax over the action sets) are not
    # near ties, so regrets agree to 1e-6 (relative 1e-9 on the larger ones of the non-robust learner).
    assert_matches_committed(data, atol=1e-6, rtol=1e-9)
