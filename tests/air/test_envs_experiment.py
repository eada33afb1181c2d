"""The embedded environments, the scripted harness and the reproduction."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

pytest.importorskip("lark")

from icml26.air.envs import FAMILIES, EmailEnv, HouseholdEnv, ShellEnv, ToolError, scenarios
from icml26.air.experiment import PRESETS, run, run_episode
from icml26.air.responder import ToolCall

from ..conftest import ROOT
from ..helpers import reproduce_in_subprocess


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


@pytest.mark.slow
def test_quick_reproduces_the_committed_conclusions(tmp_path):
    data = reproduce_in_subprocess("air", tmp_path, mode="quick")
    committed = json.loads((ROOT / "results" / "air" / "quick.json").read_text())
    assert {c["id"]: c["holds"] for c in data["claims"]} == {c["id"]: c["holds"] for c in committed["claims"]}
