"""FedIT on the federation harness: only aggregates leave a client; Flower and in-process agree."""

from __future__ import annotations

import numpy as np
import pytest

from icml26.common.federation import FederatedAlgorithm, check_payload, run_in_process
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


def test_flower_and_in_process_give_the_same_test():
    pytest.importorskip("flwr")
    clients = shared_shifts(np.random.default_rng(1), K=3, n=40, dep=0.35)
    local = FederatedIndependenceTest(null="permutation", n_permutations=50, random_state=7).fit(clients)
    flower = FederatedIndependenceTest(null="permutation", n_permutations=50, random_state=7,
                                       runner="flower").fit(clients)
    assert flower.statistic_ == local.statistic_
    assert flower.pvalue_ == local.pvalue_
    assert [s.statistic for s in flower.client_statistics_] == [s.statistic for s in local.client_statistics_]
