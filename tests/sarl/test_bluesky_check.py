"""SARL: the BlueSky cross-check (issue #27, item 4). The recording is tested in the default tier; the replay in
BlueSky is a slow test, skipped when the ``bluesky`` extra is not installed."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from icml26.common.optional import MissingExtraError, has
from icml26.sarl import AirspaceCore, KinematicSafetyShield
from icml26.sarl.lab import bluesky_check as bc
from icml26.sarl.mappo import greedy_direct


def test_recording_replays_our_core_exactly():
    """The 5 s replay of the recorded clearances reproduces the core's own trajectory at every decision."""
    rec = bc.record(n_aircraft=8, seed=3, policy="greedy_kss", radius_nm=30.0)
    core = AirspaceCore(n_envs=1, n_aircraft=8, radius_nm=30.0, scenario="streams", auto_reset=False,
                        max_steps=len(rec.cmd_hdg))  # fmt: skip
    core.reset(np.ones(1, bool), seeds=[3])
    shield = KinematicSafetyShield(core)
    assert np.allclose(rec.pos[0], np.stack([core.x[0], core.y[0]], -1))
    for k in range(len(rec.cmd_hdg)):
        a, over = shield.filter(greedy_direct(core))
        alive = core.alive[0].copy()
        core.step(a, over)
        s = (k + 1) * rec.substeps
        assert np.allclose(rec.cmd_hdg[k], core.cmd_hdg[0]) and np.allclose(rec.cmd_spd[k], core.cmd_spd[0])
        assert np.allclose(rec.pos[s][alive], np.stack([core.x[0], core.y[0]], -1)[alive], atol=1e-9)
    assert rec.alive[0].all() and not rec.alive[-1].any()
    assert (np.diff(rec.cmd_hdg, axis=0) != 0).any()  # the controller did issue instructions


def test_compare_on_identical_traces_and_bad_input():
    rec = bc.record(n_aircraft=6, seed=1, policy="fly_straight", radius_nm=30.0)
    same = bc.BlueSkyTrace(
        pos=np.where(rec.alive[..., None], rec.pos, np.nan),
        los_pairs=set(rec.los_pairs),
        minsep=bc._our_minsep(rec),
    )
    out = bc.compare(rec, same)
    assert out["ok"] and out["pos_err_max_nm"] == 0.0 and out["los_disagree"] == []
    moved = bc.BlueSkyTrace(pos=rec.pos + 2.0, los_pairs=set(), minsep=same.minsep + 4.0)
    out = bc.compare(rec, moved)
    assert not out["ok"] and any("median" in f for f in out["failures"])
    with pytest.raises(ValueError, match="policy"):
        bc.record(policy="random")
    with pytest.raises(ValueError, match="n_aircraft"):
        bc.record(n_aircraft=0)
    with pytest.raises(ValueError, match="dt"):
        bc.fly_bluesky(rec, dt=0.7)


def test_missing_bluesky_names_the_extra(monkeypatch):
    monkeypatch.setattr(bc, "_BS", None)
    monkeypatch.setitem(sys.modules, "bluesky", None)
    with pytest.raises(MissingExtraError, match=r"icml26\[bluesky\]"):
        bc.bluesky()


@pytest.mark.slow
@pytest.mark.skipif(not has("bluesky"), reason="BlueSky is not installed: pip install 'icml26[bluesky]'")
def test_bluesky_replay_agrees_within_the_stated_tolerances():
    """Three 20-aircraft streams scenarios, with no instruction and under greedy_kss, flown by both simulators:
    position error and LoS pairs within the module's tolerances (chosen before the first replay)."""
    rows = bc.cross_check(seeds=(0, 1, 2))
    for r in rows:
        assert r["ok"], (r["policy"], r["seed"], r["failures"])
        assert r["n"] == 20 and r["decisions"] > 20
    # the comparison has teeth: the fly-straight scenarios lose separation, and BlueSky sees the same pairs
    assert sum(len(r["los_bluesky"]) for r in rows if r["policy"] == "fly_straight") > 10
    assert sum(r["instructions_changed"] for r in rows if r["policy"] == "greedy_kss") > 100
