"""``XFedAlignStrategy`` inside a user's own ``ServerApp`` with a stock ``ClientApp`` (``test_strategy_user_app.py``):
with every node answering it computes ``run_in_process``'s parameters and prior bit for bit (only if the arrays
and config of ``start()`` reach the clients), ``fraction_train`` sampling, failed and silent nodes under the
failure policy, malformed replies, bad arguments; slow: Flower's simulation engine and ``flwr run``.

Central functions: ``XFedAlignStrategy.configure_train`` / ``aggregate_train`` / ``problem``, ``common.federation.sample_nodes``,
``strategy.client_app``."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from icml26.common.federation import run_in_process
from icml26.xfedalign.models import fedavg
from icml26.xfedalign.strategy import XFedAlignStrategy, artifact_of

from ..flower_grid import RecordingGrid, user_app_pyproject
from . import test_strategy_user_app as user

USER_MODULE = Path(user.__file__)



def _run(n=4, silent=None, **run_config):
    grid = RecordingGrid(user.client_app, n, run_config, silent)
    user.server_app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    return grid, dict(user.LAST)


def test_user_server_app_equals_run_in_process(task_identity):
    """Every node answers: the strategy's parameters and prior are ``run_in_process``'s (seed 5, from the
    config of ``start()``: the clients' own algorithm has seed 0)."""
    grid, out = _run(seed=5, **{"num-server-rounds": 2})
    local = run_in_process(user.make_algorithm(5, 2), user.task(4).clients)
    assert out["params"].keys() == local["params"].keys()
    for k, v in local["params"].items():
        assert out["params"][k].dtype == v.dtype
        np.testing.assert_array_equal(out["params"][k], v)
    np.testing.assert_array_equal(out["prior"], local["prior"])
    # the messages: round 1 carries start()'s arrays and config (+ server-round, beta) and the uniform prior
    first = grid.sent("train", 1)
    init = user.make_algorithm(5).initial_state([])["params"]
    for msg in first.values():
        assert all(np.array_equal(msg.content["arrays"][k].numpy(), v) for k, v in init.items())
        assert dict(msg.content["config"]) == {"seed": 5, "server-round": 1, "beta": 0.35}
        np.testing.assert_array_equal(msg.content["prior"]["prior"].numpy(), np.full((2, 10), 0.1, np.float32))
    assert len(out["evaluate"]) == 2 and 0.5 < out["evaluate"][2]["accuracy"] <= 1.0


def test_fraction_train_samples_and_aggregates_only_the_sampled(task_identity):
    grid, out = _run(seed=5, **{"fraction-train": 0.5, "min-train-nodes": 1, "num-server-rounds": 3})
    picks = [sorted(grid.sent("train", r)) for r in (1, 2, 3)]
    assert all(len(p) == 2 for p in picks) and len({tuple(p) for p in picks}) > 1
    assert [h["sampled"] for h in out["history"]] == [h["aggregated"] for h in out["history"]] == picks
    last = grid.got("train", 3)
    nodes = sorted(last)
    want = fedavg([{k: v.numpy() for k, v in last[n].content["arrays"].items()} for n in nodes],
                  [float(last[n].content["metrics"]["num-examples"]) for n in nodes])
    for k, v in want.items():
        np.testing.assert_array_equal(out["params"][k], v)


def test_failed_and_silent_nodes_are_dropped_and_a_short_round_is_skipped(task_identity):
    """Round 2: client 2 raises, client 1's reply never comes: aggregated over 0 and 3 (compared with FedAvg of
    exactly those replies). With min_train_replies=3 the same round is skipped: model and prior unchanged."""
    silent = {("train", 2): {1}}
    grid, out = _run(silent=silent, seed=5, **{"fail-ids": "[2]", "fail-round": 2, "num-server-rounds": 2})
    h = out["history"][1]
    assert h["aggregated"] == [100, 103] and not h["skipped"]
    assert h["failed"] == {101: "did not answer", 102: "raised: client 2 went away"}
    got = grid.got("train", 2)
    want = fedavg([{k: v.numpy() for k, v in got[n].content["arrays"].items()} for n in (100, 103)],
                  [float(got[n].content["metrics"]["num-examples"]) for n in (100, 103)])
    for k, v in want.items():
        np.testing.assert_array_equal(out["params"][k], v)
    grid, skipped = _run(silent=silent, seed=5, **{"fail-ids": "[2]", "fail-round": 2, "num-server-rounds": 2,
                                                   "min-train-replies": 3})
    assert skipped["history"][1]["skipped"]
    round1 = run_in_process(user.make_algorithm(5, 1), user.task(4).clients)
    for k, v in round1["params"].items():
        np.testing.assert_array_equal(skipped["params"][k], v)
    np.testing.assert_array_equal(skipped["prior"], round1["prior"])
    # round 2's messages carried round 1's prior (float32)
    np.testing.assert_array_equal(grid.sent("train", 2)[100].content["prior"]["prior"].numpy(),
                                  round1["prior"].astype(np.float32))


def test_malformed_replies_are_dropped(task_identity):
    strategy = XFedAlignStrategy(n_classes=2, n_groups=10)
    good = user.make_algorithm(0)
    params = {k: Array(v) for k, v in good.initial_state([])["params"].items()}

    def reply(metrics, config=None, arrays=params):
        rec = RecordDict({"arrays": ArrayRecord(arrays), "metrics": MetricRecord(metrics)})
        if config is not None:
            rec["explanation"] = ConfigRecord(config)
        return Message(rec, dst_node_id=0, message_type="train")

    from icml26.xfedalign.core import make_artifact

    art = make_artifact(np.ones((2, 10)), 4, noise_sigma=0.0).to_bytes()
    assert strategy.problem(reply({"num-examples": 5}, {"artifact": art})) is None
    assert "artifact" in strategy.problem(reply({"num-examples": 5}))
    wrong = make_artifact(np.ones((3, 10)), 4, noise_sigma=0.0).to_bytes()
    assert "(3, 10)" in strategy.problem(reply({"num-examples": 5}, {"artifact": wrong}))
    assert "num-examples" in strategy.problem(reply({"num-examples": 0}, {"artifact": art}))
    nan = {k: Array(np.full(v.numpy().shape, np.nan, np.float32)) for k, v in params.items()}
    assert "NaN" in strategy.problem(reply({"num-examples": 5}, {"artifact": art}, nan))
    assert artifact_of(reply({"num-examples": 5}, {"artifact": art})).to_bytes() == art


@pytest.mark.parametrize("kwargs, name", [
    (dict(n_classes=0), "n_classes"), (dict(n_groups=-1), "n_groups"), (dict(fraction_train=2.0), "fraction_train"),
    (dict(fraction_evaluate=-1.0), "fraction_evaluate"), (dict(min_train_nodes=-1), "min_train_nodes"),
    (dict(min_evaluate_nodes=0.5), "min_evaluate_nodes"), (dict(min_available_nodes=-3), "min_available_nodes"),
    (dict(min_train_replies=0), "min_train_replies"), (dict(aggregation="max"), "aggregation"),
    (dict(trim=0.5), "trim"), (dict(ema=1.0), "ema"), (dict(beta=1.5), "beta"),
    (dict(prior_key="arrays"), "prior_key"), (dict(artifact_key=""), "artifact_key"),
])
def test_bad_arguments_name_themselves(kwargs, name):
    with pytest.raises(ValueError, match=name):
        XFedAlignStrategy(**{"n_classes": 2, "n_groups": 10, **kwargs})
    with pytest.raises(TypeError, match="XFedAlign"):
        XFedAlignStrategy.from_algorithm(object())


# ------------------------------------------------------------------------------------------ real Flower runs
@pytest.mark.slow
def test_the_user_apps_run_in_flower_simulation():
    """Flower's simulation engine (``run_simulation``, Ray; deprecated in Flower 1.42 in favour of ``flwr run``, the
    next test): four virtual SuperNodes, two rounds, in process. Node ids are random here, so the average sums the
    clients in another order than ``run_in_process``: equal up to float32 rounding."""
    from flwr.simulation import run_simulation

    user.LAST.clear()
    run_simulation(server_app=user.server_app, client_app=user.client_app, num_supernodes=4,
                   backend_config={"client_resources": {"num_cpus": 1}, "init_args": {"num_cpus": 2}})
    local = run_in_process(user.make_algorithm(5, 2), user.task(4).clients)
    for k, v in local["params"].items():
        np.testing.assert_allclose(user.LAST["params"][k], v, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(user.LAST["prior"], local["prior"], rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_the_user_apps_run_with_flwr_run(tmp_path):
    """``flwr run`` of a user's app directory (this module and a pyproject.toml) on a local SuperLink, four
    simulated SuperNodes, client 3 failing from round 2; round 1 agrees with ``run_in_process``."""
    from icml26.common.federation import LocalFederation

    project = tmp_path / "user_app"
    project.mkdir()
    shutil.copy(USER_MODULE, project / "userapp.py")
    (project / "pyproject.toml").write_text(PYPROJECT)
    with LocalFederation(home=tmp_path / "flower") as federation:
        outcome = federation.run(project, {"fail-ids": "[3]", "fail-round": 2}, num_supernodes=4, timeout=600)
    history = outcome.result["history"]
    assert [len(h["aggregated"]) for h in history] == [4, 3] and len(history[1]["failed"]) == 1
    assert "client 3 went away" in next(iter(history[1]["failed"].values()))


PYPROJECT = user_app_pyproject("""
num-server-rounds = 2
seed = 5
timeout = 120.0
fail-ids = "[]"
fail-round = 1
result-path = ""
""")
