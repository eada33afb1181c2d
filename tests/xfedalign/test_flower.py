"""xFedAlign's Flower App on the federation harness: its run config and data loading; the real ServerApp and
ClientApp exchanging real Flower messages (in this process, through Flower's wire format) bit-identical to the
in-process runner, with raising and silent clients skipped and recorded by the drop rule; and real Flower runs
with ``flwr run`` on a local SuperLink (slow: each starts Ray, about a minute on two loaded cores)."""

from __future__ import annotations

import dataclasses
import importlib
import pickle
import shutil
import tomllib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Context, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import ServerApp

from icml26.common.federation import FailurePolicy, FederationError, run_in_process
from icml26.xfedalign import XFedAlign, drop_policy, run_local
from icml26.xfedalign import flower as app
from icml26.xfedalign.data import ClientData, load_task
from icml26.xfedalign.models import ModelSpec

from ..flower_grid import InlineGrid
from . import dropping_clients

DROPPING_MODULE = Path(dropping_clients.__file__)


def _app_config(app_dir: Path) -> dict:
    return tomllib.loads((app_dir / "pyproject.toml").read_text())["tool"]["flwr"]["app"]


def _setup(rounds=2, cls=XFedAlign):
    task = load_task("cancer", "iid", n_clients=4, seed=2)
    return task, cls(ModelSpec(30, 2, 8), task.groups, topk=4, lr=0.05, rounds=rounds, seed=3)


def _settings(algo):
    """What decides an XFedAlign's numbers (its attributes, the groups by their feature indices)."""
    out = {k: v for k, v in vars(algo).items() if k not in ("groups", "_membership")}
    return {**out, "groups": (algo.groups.groups, algo.groups.n_features), "cls": type(algo)}


def _same_state(got, want):
    assert got.keys() == want.keys() and got["bytes"] == want["bytes"]
    np.testing.assert_array_equal(got["prior"], want["prior"])
    assert got["params"].keys() == want["params"].keys()
    for k, v in want["params"].items():
        assert got["params"][k].dtype == v.dtype
        np.testing.assert_array_equal(got["params"][k], v)


def _same_payloads(got, want):
    assert len(got) == len(want)                                     # the same rounds
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()                                  # the same clients
        for cid in w:
            assert g[cid].keys() == w[cid].keys()
            for k, v in w[cid].items():
                assert np.array_equal(g[cid][k], v) and np.asarray(g[cid][k]).dtype == np.asarray(v).dtype, k


# ------------------------------------------------------------------------------------------- config and data
def test_app_project_names_the_apps_and_declares_every_key_the_runner_sets():
    config = _app_config(app.APP_DIR)
    assert config["components"] == {"serverapp": "icml26.xfedalign.flower:server_app",
                                    "clientapp": "icml26.xfedalign.flower:client_app"}
    for name, kind in (("serverapp", ServerApp), ("clientapp", ClientApp)):
        module, _, attr = config["components"][name].partition(":")
        assert isinstance(getattr(importlib.import_module(module), attr), kind)
    _, algo = _setup()
    algo = XFedAlign(algo.spec, algo.groups, topk=3, noise_sigma=0.0, quant_bits=6, temperature=2.0,
                     surrogate_l1=2e-3, surrogate_iters=7, aggregation="trimmed_mean", trim=0.25, ema=0,
                     beta=1, min_class_count=2, rounds=4, lr=0.2, local_epochs=3, batch_size=5, momentum=0.5,
                     l1=1e-4, seed=11)
    overrides = app.run_config_of(algo, 4, drop_policy(3, timeout=30.0))
    # flwr run refuses a run-config key the app's pyproject does not declare
    assert set(overrides) | {"data-dir", "result-path"} <= set(config["config"])
    back = app.algorithm_from_run_config({**config["config"], **overrides, "data-dir": ""})
    assert _settings(back) == _settings(algo)
    sub = app.algorithm_from_run_config({**config["config"], **overrides}, cls=dropping_clients.DroppingXFedAlign)
    assert type(sub) is dropping_clients.DroppingXFedAlign
    assert FailurePolicy.from_run_config(overrides) == FailurePolicy(3, 30.0, "skip")
    assert app.run_config_of(algo, 4)["on-short-round"] == "skip"    # the drop rule by default, every client
    assert FailurePolicy.from_run_config(config["config"]) == drop_policy()
    # the defaults run the demo world
    demo = app.algorithm_from_run_config(config["config"])
    assert (demo.spec, demo.groups.n_groups, demo.topk, demo.beta) == (ModelSpec(30, 2, 32), 10, 5, 0.35)
    with pytest.raises(ValueError, match=r"demo data \('digits'\) has \(features, classes\) = \(64, 10\)"):
        app.algorithm_from_run_config({**config["config"], "dataset": "digits"})
    digits = app.algorithm_from_run_config({**config["config"], "dataset": "digits", "groups": "digits",
                                            "n-classes": 10, "topk": 8})
    assert digits.groups == load_task("digits", "iid", n_clients=2).groups
    with pytest.raises(ValueError, match="groups must be 'cancer' or 'digits' or a JSON list of lists"):
        app.algorithm_from_run_config({**config["config"], "groups": "[[0, 1], 2]"})
    with pytest.raises(ValueError, match="partition the 3 features"):
        app.algorithm_from_run_config({**config["config"], "data-dir": "", "groups": "[[0], [2]]"})
    with pytest.raises(ValueError, match="aggregation must be one of"):
        app.algorithm_from_run_config({**config["config"], "aggregation": "max"})
    with pytest.raises(TypeError, match="XFedAlign"):
        app.run_config_of(object(), 2)
    with pytest.raises(TypeError, match="subclass"):
        app.algorithm_from_run_config(config["config"], cls=dict)


def test_a_client_loads_only_its_own_file_and_names_it_when_bad(tmp_path):
    task = load_task("cancer", "dirichlet", n_clients=3, seed=1)
    mine = dataclasses.replace(task.clients[2], attacker=4)
    paths = app.write_clients([task.clients[0], mine], tmp_path)
    got = app.load_client(1, {}, {"data-dir": str(tmp_path)})
    for f in dataclasses.fields(ClientData):
        want = getattr(mine, f.name)
        if f.name == "rows":                                          # the items' rows in the bundled data set
            assert set(got.rows) == set(want) == {"train", "val", "test"}
            assert all(np.array_equal(got.rows[k], want[k]) for k in want)
            continue
        assert np.array_equal(getattr(got, f.name), want) and np.asarray(getattr(got, f.name)).dtype == \
            np.asarray(want).dtype, f.name
    assert got.cid == 2 and got.attacker == 4                       # the file's own cid seeds its randomness
    # a SuperNode's own data-path wins over the run config
    assert app.load_client(1, {"data-path": str(paths[0])}, {"data-dir": str(tmp_path)}).cid == 0
    # a hospital's file needs only its training rows; its cid is then its partition id
    np.savez(tmp_path / "bare.npz", X_train=np.ones((4, 30), np.float32), y_train=np.array([0, 1, 1, 0]))
    bare = app.load_client(5, {"data-path": str(tmp_path / "bare.npz")}, {})
    assert (bare.cid, bare.attacker, bare.X_test.shape, bare.y_val.shape) == (5, None, (0, 30), (0,))
    np.savez(tmp_path / "float_labels.npz", X_train=np.ones((2, 30)), y_train=np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"float_labels\.npz: y_train must hold integer class labels"):
        app.load_client(0, {"data-path": str(tmp_path / "float_labels.npz")}, {})
    np.savez(tmp_path / "no_labels.npz", X_train=np.ones((2, 30)))
    with pytest.raises(ValueError, match=r"no_labels\.npz: needs the arrays X_train and y_train"):
        app.load_client(0, {"data-path": str(tmp_path / "no_labels.npz")}, {})
    with pytest.raises(ValueError, match="no data for this client"):
        app.load_client(0, {}, {"data-dir": ""})
    # the demo: every client builds the same world (the simulation's num-partitions) and keeps its part
    run_config = {"data-dir": "demo", "num-clients": 0, "dataset": "cancer", "partition": "dirichlet",
                  "data-seed": 1}
    demo = app.load_client(1, {"partition-id": 1, "num-partitions": 3}, run_config)
    assert np.array_equal(demo.X_train, task.clients[1].X_train) and demo.cid == 1
    with pytest.raises(ValueError, match="outside the demo federation of 3 clients"):
        app.load_client(3, {"num-partitions": 3}, run_config)
    for name, (d, c) in app.DEMO_SHAPES.items():
        world = load_task(name, "iid", n_clients=2)
        assert (world.n_features, world.n_classes) == (d, c)


# ------------------------------------------------------------------------- the apps, through Flower messages


def _inline_run(server_app, client_app, algo, clients, tmp_path, policy=None, silent=None):
    """The apps' outcome (``{"result", "transcript"}``) over ``clients`` written to ``tmp_path``."""
    run_config = {**_app_config(app.APP_DIR)["config"], **app.run_config_of(algo, len(clients), policy),
                  "data-dir": str(tmp_path), "result-path": str(tmp_path / "outcome.pkl")}
    app.write_clients(clients, tmp_path)
    server_app(InlineGrid(client_app, len(clients), run_config, silent),
               Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    with open(tmp_path / "outcome.pkl", "rb") as fh:
        return pickle.load(fh)


def test_the_apps_exchange_flower_messages_bit_identical_to_in_process(task_identity, tmp_path):
    task, algo = _setup(rounds=2)
    clients = task.clients[:3]
    outcome = _inline_run(app.server_app, app.client_app, algo, clients, tmp_path)
    local, log = run_in_process(algo, clients, transcript=True)
    _same_state(outcome["result"], local)                           # replies came in reverse: same float32 sums
    _same_payloads(outcome["transcript"].messages, log.messages)
    _same_payloads(outcome["transcript"].replies, log.replies)      # only parameters, counts and the artifact
    assert set(log.replies[0][0]) == {*(f"param/{k}" for k in local["params"]), "num_examples", "art_indices",
                                      "art_values", "art_scale", "art_present", "art_groups", "art_bits"}
    assert outcome["transcript"].failures == [{}, {}] and outcome["transcript"].skipped_rounds == []


def test_raising_and_silent_clients_are_skipped_and_recorded_as_in_process(task_identity, tmp_path):
    """Round 1: everyone; round 2: client 2 raises (aggregated over 0 and 1); round 3: client 2 raises, client 1
    raises, client 0 is silent on Flower (it answers in process): one answer or none, fewer than the 2 needed, so
    the round is skipped on both, model and prior unchanged."""
    task, algo = _setup(rounds=3, cls=dropping_clients.DroppingXFedAlign)
    clients, policy = task.clients[:3], drop_policy(2, timeout=30.0)
    outcome = _inline_run(dropping_clients.server_app, dropping_clients.client_app, algo, clients, tmp_path,
                          policy, silent={3: {0}})
    local, log = run_in_process(algo, clients, transcript=True, policy=policy)
    _same_state(outcome["result"], local)
    assert [r["clients"] for r in local["bytes"]] == [3, 2]
    flower = outcome["transcript"]
    went, disk = "raised RuntimeError: client 2 went away", "raised RuntimeError: client 1 lost its disk"
    assert log.failures == [{}, {2: went}, {1: disk, 2: went}]
    assert flower.failures == [{}, {2: went}, {0: "did not answer within 30 s", 1: disk, 2: went}]
    assert flower.skipped_rounds == log.skipped_rounds == [3]
    _same_payloads(flower.replies[:2], log.replies[:2])
    # the harness's 'fail' rule would stop the run at round 2 instead
    with pytest.raises(FederationError, match="round 2: 2 of 3 clients answered, fewer than the 3 needed"):
        run_in_process(algo, clients, policy=FailurePolicy())


# ------------------------------------------------------------------------------------------ real Flower runs
@pytest.mark.slow
def test_a_flower_run_agrees_with_the_in_process_runner(tmp_path):
    """``flwr run`` of xFedAlign's App project on a local SuperLink (simulation engine, three SuperNodes)."""
    task, algo = _setup(rounds=2)
    clients = task.clients[:3]
    outcome = run_local(algo, clients, home=tmp_path / "flower")
    local, log = run_in_process(algo, clients, transcript=True)
    _same_state(outcome.result, local)
    _same_payloads(outcome.transcript.replies, log.replies)
    assert outcome.transcript.failures == [{}, {}] and outcome.transcript.lost_nodes == []
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "flower").rglob("*.log"))
    assert "DEPRECATED" not in logs


@pytest.mark.slow
def test_a_client_that_drops_mid_run_is_skipped_and_recorded(tmp_path):
    """The same App project running ``DroppingXFedAlign`` (client 2 crashes from round 2, client 1 in round 3)
    with the drop rule at two answers: round 2 aggregates clients 0 and 1, round 3 is skipped; as in process."""
    project = tmp_path / "dropping_app"
    project.mkdir()
    text = (app.APP_DIR / "pyproject.toml").read_text()
    components = ('serverapp = "icml26.xfedalign.flower:server_app"\n'
                  'clientapp = "icml26.xfedalign.flower:client_app"\n')
    assert components in text
    (project / "pyproject.toml").write_text(text.replace(components, 'serverapp = "dropping_clients:server_app"\n'
                                                                     'clientapp = "dropping_clients:client_app"\n'))
    shutil.copy(DROPPING_MODULE, project / "dropping_clients.py")
    task, algo = _setup(rounds=3, cls=dropping_clients.DroppingXFedAlign)
    clients, policy = task.clients[:3], drop_policy(2, timeout=120.0)
    outcome = run_local(algo, clients, policy=policy, app_dir=project)
    local, log = run_in_process(algo, clients, transcript=True, policy=policy)
    _same_state(outcome.result, local)
    went = "raised RuntimeError: client 2 went away"
    assert outcome.transcript.failures == log.failures == [{}, {2: went},
                                                           {1: "raised RuntimeError: client 1 lost its disk", 2: went}]
    assert outcome.transcript.skipped_rounds == log.skipped_rounds == [3]
    _same_payloads(outcome.transcript.replies, log.replies)
