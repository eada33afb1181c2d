"""FedIT on the federation harness: only aggregates leave a client; the failure policy; Flower and in-process
agree (the Flower App on the simulation engine through a local SuperLink and ``flwr run``)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from icml26.common.federation import (
    FailurePolicy,
    FederatedAlgorithm,
    FederationError,
    check_payload,
    one_line,
    run_in_process,
)
from icml26.fedit import FederatedIndependenceTest, FedITQuery
from icml26.fedit.data import shared_shifts


def test_clients_send_only_aggregate_statistics():
    clients = shared_shifts(np.random.default_rng(0), dep=0.3)
    query = FedITQuery(copula=True, null="permutation", n_permutations=30, random_features=None, privacy=None,
                       seed=1)
    _, transcript = run_in_process(query, clients, transcript=True)
    raw = np.concatenate([np.concatenate([X.ravel(), Y.ravel()]) for X, Y in clients])
    for cid, reply in transcript.replies[0].items():
        assert set(reply) == {"n", "statistic", "null_mean", "null_var", "noise_var", "permuted"}
        assert reply["permuted"].shape == (30,)  # B numbers, whatever the client size
        values = np.concatenate([np.atleast_1d(np.asarray(v, dtype=float)) for v in reply.values()])
        assert not np.isin(values, raw).any(), f"client {cid} released a raw value"


def test_harness_checks_payloads():
    with pytest.raises(TypeError, match="must be a NumPy array or a scalar"):
        check_payload({"rows": [1, 2, 3]}, "reply")

    class Bad(FederatedAlgorithm):
        def client_step(self, data, message, state, rnd):
            return {"x": object()}, state

    with pytest.raises(TypeError, match="reply of client 0"):
        run_in_process(Bad(), [1])
    with pytest.raises(ValueError, match="at least one client"):
        run_in_process(Bad(), [])


class Faulty(FederatedAlgorithm):
    """Three rounds of summing the clients' values; ``fails[rnd]`` lists the clients that raise in that round."""

    rounds = 3

    def __init__(self, fails):
        self.fails = fails

    def initial_state(self, client_ids):
        return 0.0

    def client_step(self, data, message, state, rnd):
        if data in self.fails.get(rnd, ()):
            raise ValueError(f"\x1b[91mclient {data} is down\x1b[0m\nsecond line")
        return {"value": float(data)}, {"seen": int(state.get("seen", 0)) + 1}

    def aggregate(self, rnd, state, replies):
        return state + sum(r["value"] for r in replies.values())


def test_policy_skips_and_records_a_client_that_raises(caplog):
    with caplog.at_level(logging.WARNING, logger="flwr"):
        result, log = run_in_process(Faulty({1: [2], 3: [0, 3]}), [0, 1, 2, 3], transcript=True,
                                     policy=FailurePolicy(min_replies=2))
    # the server log names each dropped client in the round it was dropped (issue #45 item 8)
    assert [r.getMessage() for r in caplog.records] == [
        "round 1: client 2 raised ValueError: client 2 is down; aggregating the 3 of 4 answers",
        "round 3: client 0 raised ValueError: client 0 is down; client 3 raised ValueError: client 3 is down; "
        "aggregating the 2 of 4 answers"]
    assert result == (0 + 1 + 3) + (0 + 1 + 2 + 3) + (1 + 2)
    assert log.failures == [{2: "raised ValueError: client 2 is down"}, {},
                            {0: "raised ValueError: client 0 is down", 3: "raised ValueError: client 3 is down"}]
    assert [sorted(r) for r in log.replies] == [[0, 1, 3], [0, 1, 2, 3], [1, 2]]
    assert log.skipped_rounds == []


def test_policy_fails_a_short_round_with_one_clean_line():
    with pytest.raises(FederationError) as info:
        run_in_process(Faulty({2: [1, 2, 3]}), [0, 1, 2, 3], policy=FailurePolicy(min_replies=2))
    message = str(info.value)
    assert message == ("round 2: 1 of 4 clients answered, fewer than the 2 needed (min_replies); "
                       "client 1 raised ValueError: client 1 is down; client 2 raised ValueError: client 2 is down; "
                       "client 3 raised ValueError: client 3 is down")
    assert "\n" not in message and "\x1b" not in message
    assert info.value.transcript.failures[0] == {}  # round 1 went through, and the transcript says so
    # the default policy needs every client
    with pytest.raises(FederationError, match=r"^round 1: 3 of 4 clients answered, fewer than the 4 needed"):
        run_in_process(Faulty({1: [0]}), [0, 1, 2, 3], policy=FailurePolicy())
    # without a policy the client's own exception propagates (debugging)
    with pytest.raises(ValueError, match="client 0 is down"):
        run_in_process(Faulty({1: [0]}), [0, 1, 2, 3])


def test_policy_can_skip_a_short_round_as_xfedalign_does():
    result, log = run_in_process(Faulty({2: [1, 2, 3]}), [0, 1, 2, 3], transcript=True,
                                 policy=FailurePolicy(min_replies=2, on_short_round="skip"))
    assert result == (0 + 1 + 2 + 3) * 2  # rounds 1 and 3; round 2's lone answer is not aggregated
    assert log.skipped_rounds == [2]
    assert log.failures[1] == {c: f"raised ValueError: client {c} is down" for c in (1, 2, 3)}


def test_policy_and_one_line_reject_or_clean_bad_input():
    for bad in (dict(min_replies=0), dict(min_replies=1.5), dict(timeout=0), dict(timeout=float("inf")),
                dict(on_short_round="retry")):
        with pytest.raises(ValueError):
            FailurePolicy(**bad)
    policy = FailurePolicy(min_replies=3, timeout=12.5, on_short_round="skip")
    assert FailurePolicy.from_run_config(policy.to_run_config()) == policy
    assert FailurePolicy.from_run_config({}) == FailurePolicy()
    ray_trace = ("\x1b[36m(ClientAppActor pid=1)\x1b[0m Traceback (most recent call last):\n"
                 '  File "client.py", line 3, in step\n\x1b[91mZeroDivisionError: division by zero\x1b[0m')
    assert one_line(ray_trace) == "ZeroDivisionError: division by zero"
    assert one_line("<class 'ValueError'>:<'boom'>") == "ValueError: boom"  # Flower's own error reason
    assert one_line(KeyError()) == "KeyError"
    assert len(one_line("x" * 1000)) == 400


def test_flower_and_in_process_give_the_same_test(capfd):
    pytest.importorskip("flwr")
    clients = shared_shifts(np.random.default_rng(1), K=3, n=40, dep=0.35)
    local = FederatedIndependenceTest(null="permutation", n_permutations=50, random_state=7).fit(clients)
    # the Flower App (icml26.fedit.flower) on the simulation engine: a local SuperLink, `flwr run`, 3 SuperNodes
    flower = FederatedIndependenceTest(null="permutation", n_permutations=50, random_state=7,
                                       runner="flower").fit(clients)
    assert flower.statistic_ == local.statistic_
    assert flower.pvalue_ == local.pvalue_
    assert [s.statistic for s in flower.client_statistics_] == [s.statistic for s in local.client_statistics_]
    assert "DEPRECATED" not in capfd.readouterr().err
