"""The Shampoo reproduction: smoke run through the CLI, determinism, the ratio helper; quick run (slow)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from icml26.shampoo.experiment import PRESETS, loglog_slope, ratio_position, run

from ..conftest import ROOT
from ..helpers import reproduce_in_subprocess


def test_smoke_run_through_the_cli(tmp_path):
    data = reproduce_in_subprocess("shampoo", tmp_path, mode="smoke")
    assert {c["id"] for c in data["claims"]} == {"practice_mlp", "ideal_case", "rate_two_sided", "rate_one_sided"}
    assert set(data["arms"]) >= {"adamw", "shampoo_two_sided", "rate_shampoo_two_sided", "rate_sgd"}
    assert (tmp_path / "shampoo" / "smoke_loss_curves.png").is_file()
    assert (tmp_path / "shampoo" / "smoke_rate.png").is_file()


def test_same_seed_same_numbers():
    cfg = dataclasses.replace(PRESETS["smoke"], max_steps=20, rate_horizons=(20, 40))
    a, b = run(cfg).metrics, run(cfg).metrics
    strip = lambda m: {arm: {k: v for k, v in ms.items() if not k.endswith("ms_per_step")} for arm, ms in m.items()}  # noqa: E731
    assert strip(a) == strip(b)


def test_ratio_position_by_hand():
    # rank one: ||G||_* = ||G||_F -> r = 1/sqrt(min) -> position 0
    r, pos = ratio_position(3.0, 3.0, 16)
    assert r == pytest.approx(0.25) and pos == pytest.approx(0.0)
    # halfway on the log scale: r = min^(-1/4)
    r, pos = ratio_position(16 ** 0.25, 1.0, 16)
    assert pos == pytest.approx(0.5)
    with pytest.raises(ValueError):
        ratio_position(1.0, 1.0, 1)


def test_loglog_slope_recovers_a_power_law():
    horizons = (100, 300, 1000, 3000)
    assert loglog_slope(horizons, [5.0 * k ** -0.25 for k in horizons]) == pytest.approx(-0.25)


@pytest.mark.slow
def test_quick_reproduces_the_committed_conclusions(tmp_path):
    data = reproduce_in_subprocess("shampoo", tmp_path, mode="quick")
    committed = json.loads((ROOT / "results" / "shampoo" / "quick.json").read_text())
    assert {c["id"]: c["holds"] for c in data["claims"]} == {c["id"]: c["holds"] for c in committed["claims"]}
    assert math.isfinite(data["arms"]["shampoo_two_sided"]["digits_mlp_steps"]["mean"])
