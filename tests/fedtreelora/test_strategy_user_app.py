"""A Flower user's own apps around ``FedTreeLoRAStrategy`` (no tests here: ``test_strategy_flower.py`` runs them).

``client_app`` is a stock ClientApp written the way Flower's tutorials write one (``@app.train()``,
``@app.evaluate()``, ``msg.content["arrays"]`` / ``["config"]``), over a toy two-layer "LoRA" model in numpy: a
client moves its B factors halfway to its planted target each round, at the ``lr`` of the config. Layer 0's
target is shared by everyone; layer 1's splits the clients {0, 1} | {2, 3} (by partition id). A client whose
partition id is in the run config's ``fail-ids`` (a JSON list) raises from round ``fail-round`` on.
``server_app`` is a user's ServerApp: it builds the strategy from the run config, runs ``start`` and, when
``result-path`` is set, pickles ``{"result": ..., "transcript": None}`` there (icml26's ``LocalFederation``
reads it). The slow test copies this file beside a ``pyproject.toml`` and runs it with ``flwr run``, so it uses
absolute imports only.
"""

from __future__ import annotations

import json
import pickle

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from icml26.fedtreelora.strategy import FedTreeLoRAStrategy

D, R = 6, 2
KEYS = [f"model.layers.{layer}.self_attn.q_proj.lora_{f}.weight" for layer in (0, 1) for f in "AB"] + ["head.weight"]


def initial_arrays() -> dict[str, np.ndarray]:
    """Every client's starting point: A and B factors of two layers and a (non-LoRA) head."""
    rng = np.random.default_rng(0)
    shapes = {"A": (R, D), "B": (D, R)}
    out = {k: rng.normal(size=shapes[k.split("lora_")[1][0]] if "lora_" in k else (2, D)).astype(np.float32)
           for k in KEYS}
    return out


def target(key: str, cid: int) -> np.ndarray:
    """The planted B target of client ``cid``: shared at layer 0, one per half at layer 1."""
    rng = np.random.default_rng([7, 0 if ".layers.0." in key else 1 + cid // 2])
    return rng.normal(size=(D, R)).astype(np.float32)


def n_examples(cid: int) -> int:
    return 10 * (cid + 1)


client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    cid = int(context.node_config["partition-id"])
    config = msg.content["config"]
    fail = json.loads(str(context.run_config.get("fail-ids", "[]")))
    if cid in fail and int(config["server-round"]) >= int(context.run_config.get("fail-round", 1)):
        raise RuntimeError(f"client {cid} went away")
    lr = float(config.get("lr", 0.5))
    weights = {k: v.numpy().copy() for k, v in msg.content["arrays"].items()}
    for k in KEYS:
        if k.endswith("lora_B.weight"):
            weights[k] = (weights[k] + lr * (target(k, cid) - weights[k])).astype(np.float32)
        elif k == "head.weight":
            weights[k] = (weights[k] + np.float32(0.1 * (cid + 1))).astype(np.float32)
    return Message(RecordDict({"arrays": ArrayRecord({k: Array(weights[k]) for k in KEYS}),
                               "metrics": MetricRecord({"num-examples": n_examples(cid), "lr-seen": lr})}),
                   reply_to=msg)


@client_app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    cid = int(context.node_config["partition-id"])
    arrays = msg.content["arrays"]
    err = float(np.mean([np.mean((arrays[k].numpy() - target(k, cid)) ** 2) for k in KEYS
                         if k.endswith("lora_B.weight")]))
    return Message(RecordDict({"metrics": MetricRecord({"num-examples": n_examples(cid), "target-error": err})}),
                   reply_to=msg)


server_app = ServerApp()
LAST: dict = {}
"""The last run's outcome in this process."""


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    strategy = FedTreeLoRAStrategy(fraction_train=float(rc.get("fraction-train", 1.0)),
                                   min_train_nodes=int(rc.get("min-train-nodes", 2)),
                                   min_available_nodes=int(rc.get("min-available-nodes", 2)),
                                   min_train_replies=int(rc.get("min-train-replies", 1)),
                                   warmup_rounds=int(rc.get("warmup-rounds", 1)), seed=int(rc.get("seed", 0)))
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord({k: Array(v) for k, v in initial_arrays().items()}),
                            num_rounds=int(rc.get("num-server-rounds", 2)), timeout=float(rc.get("timeout", 120.0)),
                            train_config=ConfigRecord({"lr": float(rc.get("lr", 0.5))}))
    out = {"arrays": {k: v.numpy() for k, v in result.arrays.items()}, "tree": strategy.tree,
           "history": strategy.history, "evaluations": strategy.evaluations,
           "train_metrics": {r: dict(m) for r, m in result.train_metrics_clientapp.items()}}
    LAST.clear()
    LAST.update(out)
    path = str(rc.get("result-path", ""))
    if path:
        with open(path, "wb") as fh:
            pickle.dump({"result": out, "transcript": None}, fh)
