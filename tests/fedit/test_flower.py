"""FedIT's Flower App: its run config, its clients' data loading, and (slow) the app run with ``flwr run`` on a
local SuperLink and SuperNode subprocesses, and the failure policy on Flower with a client that raises and one
that never answers."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from icml26.common.federation import FailurePolicy, FederationError, LocalFederation, run_in_process
from icml26.fedit import FedITQuery
from icml26.fedit import flower as app
from icml26.fedit.data import shared_shifts
from icml26.fedit.test import DP

FAULTY_APP = Path(__file__).with_name("faulty_app")


def _app_config(app_dir: Path) -> dict:
    return tomllib.loads((app_dir / "pyproject.toml").read_text())["tool"]["flwr"]["app"]


def test_app_project_names_the_apps_and_declares_every_key_the_runner_sets():
    config = _app_config(app.APP_DIR)
    assert config["components"] == {"serverapp": "icml26.fedit.flower:server_app",
                                    "clientapp": "icml26.fedit.flower:client_app"}
    query = FedITQuery(copula=True, null="gamma", n_permutations=0, random_features=16, privacy=DP(2.0, 1e-6),
                       seed=11)
    overrides = app.run_config_of(query, 4, FailurePolicy(min_replies=3, timeout=30.0))
    # flwr run refuses a run-config key the app's pyproject does not declare
    assert set(overrides) | {"data-dir", "result-path"} <= set(config["config"])
    back = app.query_from_run_config({**config["config"], **overrides})
    assert vars(back) == vars(query)
    assert FailurePolicy.from_run_config(overrides) == FailurePolicy(min_replies=3, timeout=30.0)
    defaults = app.query_from_run_config(config["config"])  # the defaults make a valid test
    assert (defaults.null, defaults.privacy, defaults.random_features) == ("gamma", None, None)
    with pytest.raises(ValueError, match="privacy needs the gamma null"):
        app.query_from_run_config({**config["config"], "null": "permutation", "epsilon": 1.0})


def test_a_client_loads_only_its_own_file_and_names_it_when_bad(tmp_path):
    X, Y = np.arange(12.0).reshape(6, 2), np.arange(6.0)
    np.savez(tmp_path / "client_2.npz", X=X, Y=Y)
    loaded = app.load_client(2, {}, {"data-dir": str(tmp_path)})
    assert np.array_equal(loaded[0], X) and np.array_equal(loaded[1], Y[:, None])
    # a SuperNode's own data-path wins over the run config
    np.savez(tmp_path / "mine.npz", X=X[:5], Y=Y[:5])
    assert app.load_client(2, {"data-path": str(tmp_path / "mine.npz")}, {"data-dir": str(tmp_path)})[0].shape == (5, 2)
    np.savez(tmp_path / "client_0.npz", X=np.where(X == 3.0, np.nan, X), Y=Y)
    with pytest.raises(ValueError, match=r"client_0\.npz: X contains NaN or Inf"):
        app.load_client(0, {}, {"data-dir": str(tmp_path)})
    with pytest.raises(ValueError, match="privacy mode supports 1-D X and Y"):
        app.load_client(2, {}, {"data-dir": str(tmp_path), "epsilon": 1.0})
    with pytest.raises(ValueError, match="no data for this client"):
        app.load_client(0, {}, {"data-dir": ""})
    # the demo: every client draws the same federation (the simulation's num-partitions) and keeps its part
    run_config = {"data-dir": "demo", "num-clients": 0, "demo-seed": 4, "demo-dependence": 0.35}
    demo = shared_shifts(np.random.default_rng(4), K=3, dep=0.35)
    got = app.load_client(1, {"partition-id": 1, "num-partitions": 3}, run_config)
    assert np.array_equal(got[0], demo[1][0]) and np.array_equal(got[1], demo[1][1])
    with pytest.raises(ValueError, match="outside the demo federation of 3 clients"):
        app.load_client(3, {"num-partitions": 3}, run_config)


@pytest.mark.slow
def test_flwr_run_on_a_local_superlink_and_supernodes_equals_in_process(tmp_path):
    """The deployment engine as users run it: `flower-superlink`, one `flower-supernode` per client (each told
    only its own data file), `flwr run` (about 2 minutes on two busy cores: one process per message)."""
    clients = shared_shifts(np.random.default_rng(5), K=3, n=40, dep=0.35)
    query = FedITQuery(copula=True, null="permutation", n_permutations=20, random_features=None, privacy=None,
                       seed=9)
    paths = []
    for k, (X, Y) in enumerate(clients):
        paths.append(tmp_path / f"hospital_{k}.npz")
        np.savez(paths[-1], X=X, Y=Y)
    nodes = [{"partition-id": k, "data-path": str(p)} for k, p in enumerate(paths)]
    with LocalFederation(nodes, home=tmp_path / "flower") as federation:
        outcome = federation.run(app.APP_DIR, {**app.run_config_of(query, 3), "data-dir": ""})
    (stats, test), (local_stats, local_test) = outcome.result, run_in_process(query, clients)
    assert (test.statistic, test.pvalue) == (local_test.statistic, local_test.pvalue)
    assert [s.statistic for s in stats] == [s.statistic for s in local_stats]
    _, local_log = run_in_process(query, clients, transcript=True)
    assert outcome.transcript.messages == local_log.messages
    for got, want in zip(outcome.transcript.replies[0].values(), local_log.replies[0].values(), strict=True):
        assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in got)
    assert outcome.transcript.failures == [{}]
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "flower").glob("*.log"))
    assert "DEPRECATED" not in logs and "supernode" in "".join(p.name for p in (tmp_path / "flower").iterdir())


@pytest.mark.slow
def test_a_client_that_raises_and_one_that_never_answers_on_flower():
    """The harness's policy inside a real ServerApp (simulation engine): round 1 goes on without client 2 (raises)
    and client 3 (silent past the 10 s round timeout); round 2 has one answer of the two needed and stops the run
    with one plain line (no ANSI colour, no Ray trace). About a minute: Ray starts first."""
    with LocalFederation() as federation, pytest.raises(FederationError) as info:
        federation.run(FAULTY_APP, {"round-timeout": 10.0, "hang-seconds": 25.0}, num_supernodes=4)
    message = str(info.value)
    assert message == ("round 2: 1 of 4 clients answered, fewer than the 2 needed (min_replies); "
                       "client 1 raised ValueError: client 1 cannot answer round 2; "
                       "client 2 raised ValueError: client 2 cannot answer round 2; "
                       "client 3 raised ValueError: client 3 cannot answer round 2")
    assert not any(bad in message for bad in ("\x1b", "\n", "Traceback", "ray", "Ray"))
    log = info.value.transcript
    assert log.failures[0] == {2: "raised ValueError: client 2 cannot answer round 1",
                               3: "did not answer within 10 s"}
    assert log.replies[0] == {0: {"value": 0.0}, 1: {"value": 1.0}}  # round 1 aggregated what arrived
    assert log.lost_nodes == [] and log.skipped_rounds == []


def test_the_local_runner_refuses_what_flwr_run_would_reject_vaguely(tmp_path):
    federation = LocalFederation(home=tmp_path)  # not started: these checks come first
    with pytest.raises(ValueError, match=r"run config key\(s\) nulll are not declared in .*pyproject.toml"):
        federation.run(app.APP_DIR, {"nulll": "gamma"})
    with pytest.raises(FileNotFoundError, match="is not a Flower App project"):
        federation.run(tmp_path, {})
    with pytest.raises(RuntimeError, match="start the LocalFederation first"):
        federation.run(app.APP_DIR, {"null": "gamma"})


def test_close_stops_what_the_spawned_processes_started(tmp_path):
    """A SuperLink starts flwr-simulation; close() must stop such children too (a process that spawns one here)."""
    import os
    import sys
    import time

    federation = LocalFederation(home=tmp_path)
    federation.home = tmp_path
    pid_file = tmp_path / "child.pid"
    code = ("import subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
            f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
            "time.sleep(600)\n")
    parent = federation._spawn([sys.executable, "-c", code], "superlink")
    deadline = time.monotonic() + 60
    while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    child = int(pid_file.read_text())
    federation.close()
    assert parent.poll() is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{child}/stat") as stat:  # a zombie (killed, not yet reaped by init) counts as stopped
            if stat.read().split(") ")[-1].startswith("Z"):
                break
        time.sleep(0.2)
    else:
        os.kill(child, 9)
        raise AssertionError("the spawned process's child outlived close()")
