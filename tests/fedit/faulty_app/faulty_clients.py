"""Clients that fail on purpose, on the federation harness (a Flower App; see pyproject.toml beside it).

Each client answers its partition id; in round 1 client 2 raises and client 3 sleeps past the round timeout, in
round 2 clients 1, 2 and 3 raise. With ``min-replies = 2`` round 1 goes on without clients 2 and 3 and round 2
stops the run.
"""

from __future__ import annotations

import time

import numpy as np

from icml26.common.federation import FederatedAlgorithm, flower_client_app, flower_server_app


class FaultySum(FederatedAlgorithm):
    rounds = 2

    def __init__(self, hang_seconds: float = 60.0):
        self.hang_seconds = hang_seconds

    def initial_state(self, client_ids):
        return 0.0

    def client_step(self, data, message, state, rnd):
        cid = int(data[0])
        if (rnd, cid) == (1, 3):
            time.sleep(self.hang_seconds)
        if (rnd, cid) == (1, 2) or (rnd == 2 and cid > 0):
            raise ValueError(f"client {cid} cannot answer round {rnd}")
        return {"value": float(cid)}, state

    def aggregate(self, rnd, state, replies):
        return state + sum(r["value"] for r in replies.values())


def make_algorithm(run_config):
    return FaultySum(float(run_config.get("hang-seconds", 60.0)))


def load_data(partition_id, node_config, run_config):
    return np.array([partition_id])


server_app = flower_server_app(make_algorithm)
client_app = flower_client_app(make_algorithm, load_data)
