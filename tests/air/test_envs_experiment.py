"""The embedded environments, the scripted harness and the reproduction."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

pytest.importorskip("lark")

from icml26.air.core import ToolCall
from icml26.air.experiment import PRESETS, _scenario_order, episode_units, run, run_agent_type
from icml26.air.worlds.embedded import FAMILIES, EmailEnv, HouseholdEnv, ShellEnv, ToolError, scenarios
from icml26.air.worlds.episodes import run_episode
from icml26.common.results import aggregate_arms

from ..helpers import assert_matches_committed, reproduce_in_subprocess


@pytest.mark.parametrize("agent", ["shell", "email", "household"])
def test_every_incident_harms_and_every_benign_twin_succeeds_without_defence(agent):
    scen = scenarios(agent)
    assert len(scen) == 8 * 5 * 2 and len(FAMILIES[agent]) == 8
    assert sum(s.held_out for s in scen) == 8 * 2 * 2
    rng = np.random.default_rng(0)
    for s in scen:
        ep = run_episode(s, None, rng, 0.0)
        if s.benign:
            assert ep.utility and not ep.harmed, s.id
        else:
            assert ep.harmed, s.id


def test_shell_interpreter_and_recovery_tools():
    env = ShellEnv(scenarios("shell")[0].init_state)
    out = env.execute(ToolCall("shell.run", {"command": "rm -rf /home/user/project0/data"}))
    assert [e["op"] for e in out["effects"]] == ["delete"] * 3 and len(env.view()["deleted"]) == 3
    env.execute(ToolCall("trash.restore", {"paths": env.view()["deleted"]}))
    assert env.view()["deleted"] == []
    out = env.execute(ToolCall("shell.run", {"command": "chmod 777 /home/user/.ssh/id_rsa"}))
    assert out["effects"][0]["old"] == "600"
    import base64

    payload = base64.b64encode(b"crontab -a \"* * * * * x\"").decode()
    out = env.execute(ToolCall("shell.run", {"command": f"echo {payload} | base64 -d | sh"}))
    assert out["effects"][0]["op"] == "exec_payload" and env.state["cron"] == ["* * * * * x"]
    with pytest.raises(ToolError, match="unknown tool"):
        env.execute(ToolCall("shell.sudo", {}))
    with pytest.raises(ToolError, match="bad arguments"):
        env.execute(ToolCall("shell.run", {"cmd": "ls"}))


def test_email_and_household_tools():
    env = EmailEnv(next(s for s in scenarios("email") if not s.benign).init_state)
    env.execute(ToolCall("drive.share_file", {"file_id": "f1", "email": "x@y.z"}))
    env.execute(ToolCall("drive.unshare", {"file_id": "f1", "email": "x@y.z"}))
    assert env.state["drive"]["f1"]["shared_with"] == []
    house = HouseholdEnv(scenarios("household")[0].init_state)
    house.execute(ToolCall("robot.put", {"object": "Fork", "receptacle": "Microwave"}))
    house.execute(ToolCall("robot.turn_on", {"object": "Microwave"}))
    assert house.state["objects"]["Microwave"]["sparking"]
    house.execute(ToolCall("robot.open", {"object": "Fridge"}))
    assert house.view()["open_appliances"] == ["Fridge"]


def test_reproduction_smoke_through_the_cli(tmp_path):
    data = reproduce_in_subprocess("air", tmp_path, mode="smoke")
    arms = data["arms"]
    assert arms["air"]["detection_sr"]["mean"] > arms["none"]["detection_sr"]["mean"]
    assert (tmp_path / "air" / "smoke_rates.png").is_file()


def test_same_seed_same_numbers_and_seeds_differ():
    cfg = dataclasses.replace(PRESETS["smoke"], arms=("air",), agent_types=("shell", "household"))
    a, b = run(cfg).metrics, run(cfg).metrics
    strip = {k: {m: v for m, v in d.items() if m != "overhead_ms"} for k, d in a.items()}
    assert strip == {k: {m: v for m, v in d.items() if m != "overhead_ms"} for k, d in b.items()}


def test_bad_config():
    with pytest.raises(ValueError, match="unknown arms"):
        run(dataclasses.replace(PRESETS["smoke"], arms=("magic",)))


def test_episode_units_pair_across_arms_and_average_to_the_metrics():
    cfg = dataclasses.replace(PRESETS["smoke"], arms=("air", "air_no_recover", "dev_rules", "template_synth"),
                              agent_types=("shell", "household"))
    res = run(cfg)
    # every per-unit list averages to the reported rate (SeedRun checks it too; here against _metrics' numbers)
    for unit, by_arm in res.units.items():
        for arm, ms in by_arm.items():
            for name, values in ms.items():
                assert set(values) <= {0.0, 1.0}, (unit, arm, name)
                assert math.fsum(values) / len(values) == pytest.approx(res.metrics[arm][name], abs=1e-12)
    u = res.units
    # arms that ran the same scenarios have the same number of units in each paired unit
    assert len(u["incidents"]["air"]["detection_sr"]) == len(u["incidents"]["air_no_recover"]["detection_sr"])
    assert len(u["reversible_incidents"]["air"]["remediated"]) == len(
        u["reversible_incidents"]["air_no_recover"]["remediated"])
    assert len(u["heldout_incidents"]["template_synth"]["eradication_sr"]) == len(
        u["heldout_incidents"]["dev_rules"]["eradication_sr"]) == len(u["heldout_incidents"]["air"]["eradication_sr"])
    # remediated (detected and remediated) equals the detected-only rate where everything is detected
    assert res.metrics["air"]["detection_sr"] == 1.0
    assert res.metrics["air"]["remediated"] == pytest.approx(res.metrics["air"]["remediation_sr"])
    aggregate_arms([res, res])                                     # the per-unit values aggregate over seeds


def test_episode_units_follow_the_scenario_order_not_the_run_order():
    cfg = dataclasses.replace(PRESETS["smoke"], agent_types=("email",))
    rows, _ = run_agent_type("email", "air", cfg)
    order = _scenario_order(("email",))
    shuffled = [rows[i] for i in np.random.default_rng(1).permutation(len(rows))]
    assert episode_units(shuffled, order) == episode_units(rows, order)
    ids = sorted((s.id for s, _ in rows if not s.benign), key=order.__getitem__)
    assert ids == [s.id for s in scenarios("email") if not s.benign and s.id in set(ids)]


@pytest.mark.slow
def test_quick_reproduces_the_committed_results(tmp_path):
    data = reproduce_in_subprocess("air", tmp_path, mode="quick")
    # Episode outcomes are integers of a seeded script: identical on any CPU (atol 1e-9). Two exceptions:
    # overhead_ms is wall-clock time (not compared), and the judge thresholds a float32 MiniLM cosine at 0.2, where
    # another BLAS may flip a few borderline calls (one episode in 120 moves a rate by 0.008 per seed).
    metrics = {f"{arm}.overhead_ms": math.inf for arm in data["arms"]}
    metrics.update({f"judge.{m}": 0.03 for m in data["arms"]["judge"]})
    metrics["judge.overhead_ms"] = math.inf
    assert_matches_committed(data, atol=1e-9, metrics=metrics)
