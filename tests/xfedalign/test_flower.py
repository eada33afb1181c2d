"""xFedAlign on Flower: the strategy's aggregation and failure policy (no simulation), and real Flower runs (slow).

The two simulations start Ray (about 40-60 s each on two loaded cores), so they are in the slow tier.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from icml26.common.federation import run_in_process
from icml26.xfedalign import XFedAlign
from icml26.xfedalign.data import load_task
from icml26.xfedalign.models import ModelSpec

flwr = pytest.importorskip("flwr")


@pytest.fixture
def task_identity():
    """Flower builds messages from the running task's identity; set one for messages made outside a run."""
    from flwr.supercore.task_identity import TaskIdentity

    before = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = before


def _setup(rounds=1):
    task = load_task("cancer", "iid", n_clients=4, seed=2)
    return task, XFedAlign(ModelSpec(30, 2, 8), task.groups, topk=4, lr=0.05, rounds=rounds, seed=3)


def test_strategy_skips_failed_clients_and_matches_the_in_process_aggregate(task_identity):
    from flwr.app import Error, Message, RecordDict

    from icml26.xfedalign.strategy import XFedAlignStrategy, reply_content

    task, algo = _setup()
    state = algo.initial_state([0, 1, 2, 3])
    msgs = algo.configure(1, state, [0, 1, 2, 3])
    replies = {cid: algo.client_step(task.clients[cid], msgs[cid], {}, 1)[0] for cid in range(4)}
    outgoing = {cid: Message(content=RecordDict(), dst_node_id=100 + cid, message_type="train") for cid in range(4)}
    flower = [Message(content=reply_content(replies[cid], cid), reply_to=outgoing[cid]) for cid in (3, 0, 1)]
    flower.append(Message(error=Error(code=0, reason="client 2 lost its connection"), reply_to=outgoing[2]))

    strategy = XFedAlignStrategy(algo, min_replies=2)
    arrays, _ = strategy.aggregate_train(1, flower)
    expected = algo.aggregate(1, state, {cid: replies[cid] for cid in (0, 1, 3)})
    for k, v in expected["params"].items():
        np.testing.assert_array_equal(arrays[k].numpy(), v)                # same order, same float32 sums
    np.testing.assert_array_equal(strategy.prior, expected["prior"])
    assert strategy.history[-1] == {"round": 1, "answered": [0, 1, 3], "failed_nodes": [102], "aggregated": True}

    before = strategy.prior.copy()
    arrays, metrics = strategy.aggregate_train(2, flower[:1] + flower[3:])  # one success, one failure
    assert arrays is None and metrics is None                              # below min_replies: round skipped
    assert strategy.history[-1]["aggregated"] is False
    np.testing.assert_array_equal(strategy.prior, before)
    with pytest.raises(TypeError, match="XFedAlign"):
        XFedAlignStrategy(object())
    with pytest.raises(ValueError, match="min_replies"):
        XFedAlignStrategy(algo, min_replies=0)


@pytest.mark.slow
def test_a_flower_run_agrees_with_the_in_process_runner():
    from icml26.xfedalign import run_flower_strategy

    task, algo = _setup(rounds=2)
    clients = task.clients[:3]
    local = run_in_process(algo, clients)
    flower = run_flower_strategy(algo, clients)
    for k, v in local["params"].items():
        np.testing.assert_array_equal(flower["params"][k], v)
    np.testing.assert_array_equal(flower["prior"], local["prior"])
    assert [h["answered"] for h in flower["history"]] == [[0, 1, 2], [0, 1, 2]]


class _Dropping(XFedAlign):
    """Client 2 fails from round 2 on (a crash mid-run)."""

    def client_step(self, data, message, state, rnd):
        if data.cid == 2 and rnd >= 2:
            raise RuntimeError("client 2 went away")
        return super().client_step(data, message, state, rnd)


@pytest.mark.slow
def test_a_client_that_drops_mid_run_is_skipped_and_recorded():
    from icml26.xfedalign import run_flower_strategy

    task, algo = _setup(rounds=2)
    dropping = _Dropping(algo.spec, task.groups, topk=4, lr=0.05, rounds=2, seed=3)
    clients = task.clients[:3]
    flower = run_flower_strategy(dropping, clients, min_replies=2, timeout=120)
    assert flower["history"][0]["answered"] == [0, 1, 2]
    assert flower["history"][1]["answered"] == [0, 1] and len(flower["history"][1]["failed_nodes"]) == 1
    # the same rounds in process: everyone in round 1, clients 0 and 1 in round 2
    state = algo.initial_state([0, 1, 2])
    for rnd, ids in ((1, [0, 1, 2]), (2, [0, 1])):
        msgs = algo.configure(rnd, state, ids)
        replies = {cid: algo.client_step(clients[cid], msgs[cid], {}, rnd)[0] for cid in ids}
        state = algo.aggregate(rnd, state, replies)
    np.testing.assert_array_equal(flower["prior"], state["prior"])
    for k, v in state["params"].items():
        np.testing.assert_array_equal(flower["params"][k], v)


def test_artifacts_fit_a_config_record_and_round_trip(task_identity):
    from icml26.xfedalign.core import SparseArtifact
    from icml26.xfedalign.strategy import reply_content

    task, algo = _setup()
    state = algo.initial_state([0])
    reply = algo.client_step(task.clients[0], algo.configure(1, state, [0])[0], {}, 1)[0]
    content = reply_content(reply, 0)
    back = SparseArtifact.from_bytes(content["xfedalign"]["artifact"])
    np.testing.assert_array_equal(back.dense(), SparseArtifact.from_payload(reply).dense())
    assert content["metrics"]["partition-id"] == 0 and len(content.array_records) == 1
    assert dataclasses.is_dataclass(task.clients[0])
