"""A Flower user's own apps around ``XFedAlignStrategy`` (no tests here: ``test_strategy_flower.py`` runs them).

``client_app`` is a stock ClientApp (``@app.train()``, ``@app.evaluate()``) delegating to the library's
``strategy.client_app`` over the embedded cancer world (``load_task("cancer", "iid")`` split over the node's
``num-partitions``); a client whose partition id is in the run config's ``fail-ids`` (a JSON list) raises from
round ``fail-round`` on. The client's own algorithm has seed 0: its shuffles and noise follow the ``seed`` of
the config that ``start()`` sends. ``server_app`` is a user's ServerApp: the strategy from ``make_algorithm``'s
settings, ``start`` from the parameters of ``make_algorithm(seed)`` with ``train_config={"seed": seed}``; when
``result-path`` is set it pickles ``{"result": ..., "transcript": None}`` there (icml26's ``LocalFederation``
reads it). The slow test copies this file beside a ``pyproject.toml`` and runs it with ``flwr run``.
"""

from __future__ import annotations

import json
import pickle

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from icml26.xfedalign.core import XFedAlign
from icml26.xfedalign.data import load_task
from icml26.xfedalign.models import ModelSpec
from icml26.xfedalign.strategy import XFedAlignStrategy
from icml26.xfedalign.strategy import client_app as library_client_app

_TASKS: dict[int, object] = {}


def task(n_clients: int):
    if n_clients not in _TASKS:
        _TASKS[n_clients] = load_task("cancer", "iid", n_clients=n_clients, seed=2)
    return _TASKS[n_clients]


def make_algorithm(seed: int = 0, rounds: int = 2) -> XFedAlign:
    return XFedAlign(ModelSpec(30, 2, 8), task(2).groups, topk=4, lr=0.05, rounds=rounds, seed=seed)


client_app = ClientApp()
_library = {}


def _inner(context: Context) -> ClientApp:
    n = int(context.node_config["num-partitions"])
    if n not in _library:
        _library[n] = library_client_app(make_algorithm(0), lambda cid: task(n).clients[cid])
    return _library[n]


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    cid = int(context.node_config["partition-id"])
    fail = json.loads(str(context.run_config.get("fail-ids", "[]")))
    if cid in fail and int(msg.content["config"]["server-round"]) >= int(context.run_config.get("fail-round", 1)):
        raise RuntimeError(f"client {cid} went away")
    return _inner(context)(msg, context)


@client_app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return _inner(context)(msg, context)


server_app = ServerApp()
LAST: dict = {}
"""The last run's outcome in this process (and its strategy)."""


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    seed, rounds = int(rc.get("seed", 5)), int(rc.get("num-server-rounds", 2))
    algorithm = make_algorithm(seed, rounds)
    strategy = XFedAlignStrategy.from_algorithm(algorithm, fraction_train=float(rc.get("fraction-train", 1.0)),
                                                min_train_nodes=int(rc.get("min-train-nodes", 2)),
                                                min_train_replies=int(rc.get("min-train-replies", 1)), seed=0)
    params = algorithm.initial_state([])["params"]
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord({k: Array(v) for k, v in params.items()}),
                            num_rounds=rounds, timeout=float(rc.get("timeout", 120.0)),
                            train_config=ConfigRecord({"seed": seed}))
    out = {"params": {k: v.numpy() for k, v in result.arrays.items()}, "prior": strategy.prior,
           "history": strategy.history, "evaluate": {r: dict(m) for r, m in result.evaluate_metrics_clientapp.items()}}
    LAST.clear()
    LAST.update(out, strategy=strategy)
    path = str(rc.get("result-path", ""))
    if path:
        with open(path, "wb") as fh:
            pickle.dump({"result": out, "transcript": None}, fh)
