"""FedTreeLoRA on Flower: ``FedTreeLoRAStrategy``, a personalised ``flwr.serverapp.strategy.Strategy``, and its
``ClientApp``.

Personalised aggregation needs a different payload per client, so the strategy does not broadcast one model:

- the first round maps Flower's random node ids to the clients' ``partition-id`` with one ``query`` message each
  (clients echo ``context.node_config["partition-id"]``);
- ``configure_train`` sends every node **its own** ``Message``: the cluster experts (``clus/<peft key>``) and
  external experts (``ext/<peft key>``) the algorithm's server state holds for that client, plus the phase and
  the round, as an ``ArrayRecord`` + ``ConfigRecord`` (``common.federation.payload_to_records``);
- the client (``client_app``) runs the same ``FederatedLoRA.client_step`` as the in-process runner, keeps its
  private adapters and gates in ``context.state`` and answers with its uploaded keys and its partition id;
- ``aggregate_train`` regroups the replies by partition id and calls the algorithm's ``aggregate`` (tree, cuts,
  cluster and external experts); it returns the **trunk**, the adapters every client shares (layers cut into one
  cluster), as the round's global ``ArrayRecord``, and the round's byte counts as metrics;
- after the last round ``configure_evaluate`` sends the evaluation messages (``message_type="evaluate"``);
  ``aggregate_evaluate`` stores each client's per-item correctness and returns the mean accuracies.

The strategy works with every ``core.FederatedLoRA`` (FedTreeLoRA and the baselines); driven by Flower's
``Strategy.start`` it gives bit-identical adapters and outcomes to ``common.federation.run_in_process``
(``tests/fedtreelora/test_flower.py``). It is for users who compose their own ``ServerApp`` around a
``Strategy``; the packaged Flower App (``flwr run``, failure policy, local SuperLink runner) is ``flower.py``, built
on the federation harness. Needs the ``fl`` extra (and ``hf`` for the client's model).

Example (inside a ``ServerApp``'s ``main(grid, context)``; ``client_app(algo, load)`` on the nodes):
    >>> strategy = FedTreeLoRAStrategy(algo, n_clients=8)                     # doctest: +SKIP
    >>> result = strategy.start(grid=grid, initial_arrays=ArrayRecord(),
    ...                         num_rounds=strategy.num_rounds)                # doctest: +SKIP
    >>> algo.result(strategy.state)["log"]["cuts"]                             # doctest: +SKIP
    [1, 2, 4, 4]
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..common.federation import check_payload, payload_to_records, records_to_payload
from ..common.optional import requires

requires("flwr", extra="fedtreelora", purpose="the Flower strategy of FedTreeLoRA")

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import Strategy  # noqa: E402

from .core import CLUS, EXT, FederatedLoRA  # noqa: E402

_ROUND, _PARTITION, _HELLO = "__round", "__partition", "__hello"


class FedTreeLoRAStrategy(Strategy):
    """A personalised Flower strategy: one message per node from a ``core.FederatedLoRA``'s server state.

    Args:
        algorithm: ``FedTreeLoRA`` (or any ``FederatedLoRA`` baseline); the client app must hold the same one.
        n_clients: number of SuperNodes (all take part in every round).
        timeout: seconds to wait for the partition-id query.

    Attributes:
        state: the algorithm's server state (tree, cuts, messages, byte counts; after the run ``val``/``test``).
        partition_of: Flower node id -> partition id.
    """

    def __init__(self, algorithm: FederatedLoRA, n_clients: int, *, timeout: float = 600.0):
        if not isinstance(algorithm, FederatedLoRA):
            raise TypeError(f"algorithm must be a FederatedLoRA (e.g. FedTreeLoRA), got {type(algorithm).__name__}")
        if isinstance(n_clients, bool) or not isinstance(n_clients, int) or n_clients < 1:
            raise ValueError(f"n_clients must be a positive int, got {n_clients!r}")
        self.algorithm, self.n_clients, self.timeout = algorithm, n_clients, float(timeout)
        self.ids = list(range(n_clients))
        self.state = algorithm.initial_state(self.ids)
        self.partition_of: dict[int, int] = {}

    @property
    def num_rounds(self) -> int:
        """Flower rounds: the algorithm's training rounds (its evaluation runs in the last round's evaluate)."""
        return self.algorithm.train_rounds

    def summary(self) -> None:
        """Nothing to log beyond Flower's own round lines."""

    def _map_partitions(self, grid: Grid) -> dict[int, int]:
        if len(self.partition_of) == self.n_clients:
            return {cid: node for node, cid in self.partition_of.items()}
        deadline = time.monotonic() + self.timeout
        nodes = list(grid.get_node_ids())
        while len(nodes) < self.n_clients:  # SuperNodes register asynchronously
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(nodes)} of {self.n_clients} Flower nodes registered")
            time.sleep(0.1)
            nodes = list(grid.get_node_ids())
        if len(nodes) != self.n_clients:
            raise RuntimeError(f"{len(nodes)} Flower nodes for {self.n_clients} clients")
        hello = [Message(content=payload_to_records({_HELLO: True}), dst_node_id=node, message_type="query")
                 for node in nodes]
        for reply in grid.send_and_receive(hello, timeout=self.timeout):
            if reply.has_error():
                raise RuntimeError(f"a Flower client failed to report its partition: {reply.error}")
            self.partition_of[reply.metadata.src_node_id] = int(records_to_payload(reply.content)[_PARTITION])
        if sorted(self.partition_of.values()) != self.ids:
            raise RuntimeError(f"Flower nodes reported partitions {sorted(self.partition_of.values())}")
        return {cid: node for node, cid in self.partition_of.items()}

    def _messages(self, rnd: int, grid: Grid, message_type: str) -> list[Message]:
        node_of = self._map_partitions(grid)
        payloads = self.algorithm.configure(rnd, self.state, self.ids)
        return [Message(content=payload_to_records({**check_payload(payloads[cid], f"message to client {cid}"),
                                                    _ROUND: rnd}),
                        dst_node_id=node_of[cid], message_type=message_type) for cid in self.ids]

    def _replies(self, replies: Iterable[Message]) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for reply in replies:
            if reply.has_error():
                raise RuntimeError(f"a Flower client failed: {reply.error}")
            payload = records_to_payload(reply.content)
            out[int(payload.pop(_PARTITION))] = payload
        if sorted(out) != self.ids:
            raise RuntimeError(f"replies from partitions {sorted(out)}, expected {self.ids}")
        return out

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
                        ) -> Iterable[Message]:
        """Every node's own message: its cluster and external experts for this round."""
        return self._messages(server_round, grid, "train")

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The algorithm's aggregation (tree and cuts after the warm-up); returns the shared trunk and byte counts."""
        self.state = self.algorithm.aggregate(server_round, self.state, self._replies(replies))
        return self.trunk(), MetricRecord({"bytes-up": int(self.state["bytes_up"][-1]),
                                           "bytes-down": int(self.state["bytes_down"][-1])})

    def trunk(self) -> ArrayRecord:
        """The adapters every client receives identically (the layers shared by all), as one ``ArrayRecord``."""
        msgs = self.state["messages"]
        if not msgs:
            return ArrayRecord()
        shared = {}
        for k, v in msgs[self.ids[0]].items():
            if not k.startswith(CLUS) or any(EXT + k[len(CLUS):] in msgs[c] for c in self.ids):
                continue
            if all(k in msgs[c] and np.array_equal(msgs[c][k], v) for c in self.ids):
                shared[k] = v
        return ArrayRecord({k[len(CLUS):]: Array(np.ascontiguousarray(v)) for k, v in shared.items()})

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
                           ) -> Iterable[Message]:
        """After the last training round: every client evaluates its personalised model."""
        if server_round < self.num_rounds:
            return []
        return self._messages(self.num_rounds + 1, grid, "evaluate")

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Per-client correctness into the state; mean validation and test accuracy as metrics."""
        replies = list(replies)
        if not replies:
            return None
        self.state = self.algorithm.aggregate(self.num_rounds + 1, self.state, self._replies(replies))
        return MetricRecord({"val-accuracy": float(np.mean([v.mean() for v in self.state["val"].values()])),
                             "test-accuracy": float(np.mean([v.mean() for v in self.state["test"].values()]))})


def _store_state(records: Any, state: dict[str, Any]) -> None:
    converted = payload_to_records(state)
    records["fedtreelora_arrays"] = converted["arrays"]
    records["fedtreelora_scalars"] = converted["scalars"]


def _load_state(records: Any) -> dict[str, Any]:
    if "fedtreelora_arrays" not in records:
        return {}
    out: dict[str, Any] = {k: v.numpy() for k, v in records["fedtreelora_arrays"].items()}
    out.update(dict(records["fedtreelora_scalars"].items()))
    return out


def client_app(algorithm: FederatedLoRA, load_client: Callable[[int], Any]) -> ClientApp:
    """A ``ClientApp`` running ``algorithm.client_step`` on ``load_client(partition_id)`` (only its own data).

    Its private adapters and gates live in ``context.state`` across rounds.
    """
    app = ClientApp()

    def handle(msg: Message, context: Context) -> Message:
        cid = int(context.node_config["partition-id"])
        payload = records_to_payload(msg.content)
        if payload.pop(_HELLO, False):
            return Message(content=payload_to_records({_PARTITION: cid}), reply_to=msg)
        rnd = int(payload.pop(_ROUND))
        reply, new_state = algorithm.client_step(load_client(cid), payload, _load_state(context.state), rnd)
        _store_state(context.state, check_payload(new_state, f"client {cid} state"))
        out = {**check_payload(reply, f"round {rnd} reply of client {cid}"), _PARTITION: cid}
        return Message(content=payload_to_records(out), reply_to=msg)

    app.query()(handle)
    app.train()(handle)
    app.evaluate()(handle)
    return app


def server_app(strategy: FedTreeLoRAStrategy, outcome: dict[str, Any] | None = None) -> ServerApp:
    """A ``ServerApp`` running ``strategy`` for its algorithm's rounds; fills ``outcome`` (``result`` or ``error``)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            result = strategy.start(grid=grid, initial_arrays=ArrayRecord(), num_rounds=strategy.num_rounds,
                                    timeout=strategy.timeout)
            if outcome is not None:
                outcome["result"] = result
        except BaseException as exc:  # surfaced to the caller through outcome
            if outcome is None:
                raise
            outcome["error"] = exc

    return app
