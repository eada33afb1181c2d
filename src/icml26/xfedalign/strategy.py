"""xFedAlign on Flower: ``XFedAlignStrategy`` (a ``flwr.serverapp.strategy.FedAvg``) and its ``ClientApp``.

The task model is aggregated by Flower's own FedAvg; the explanation channel rides beside it in
``ConfigRecord``s, so FedAvg's "one ArrayRecord, one MetricRecord" rule holds:

- down (``configure_train``): the train config carries ``prior`` (the (C, G) prior as float32 bytes),
  ``beta`` and ``seed``;
- up (the client's ``@app.train()``): ``arrays`` (its parameters), ``metrics`` (``num-examples`` and its
  ``partition-id``), and a ``ConfigRecord`` ``"xfedalign"`` whose ``artifact`` is ``SparseArtifact.to_bytes()``;
- ``aggregate_train`` orders the replies by partition id (so the float32 sums match ``run_in_process``), lets
  FedAvg average the parameters and folds the artifacts into the prior with ``XFedAlign.aggregate_explanations``.

**Failures** (the policy): a reply that carries an error (the client raised) or never arrives (Flower's
timeout) is skipped and recorded in ``history``; the round aggregates the replies that did arrive if there are
at least ``min_replies`` of them, otherwise the round is skipped (model and prior unchanged) and recorded.

Both sides call the same ``core.XFedAlign`` code as the in-process runner, and a Flower run gives bit-identical
parameters and prior (``tests/xfedalign/test_flower.py``). Needs the ``fl`` extra.

Example (a Flower simulation, about a minute on two cores: Ray starts first):
    >>> from icml26.xfedalign import XFedAlign, run_flower_strategy
    >>> from icml26.xfedalign.data import load_task
    >>> from icml26.xfedalign.models import ModelSpec
    >>> task = load_task("cancer", "iid", n_clients=3, seed=0)
    >>> algo = XFedAlign(ModelSpec(30, 2, 16), task.groups, rounds=2, topk=4)
    >>> out = run_flower_strategy(algo, task.clients)          # doctest: +SKIP
    >>> out["prior"].shape                                      # doctest: +SKIP
    (2, 10)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ..common.optional import requires

requires("flwr", extra="fl", purpose="the Flower strategy of xFedAlign")

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402

from .core import PARAM, SparseArtifact, XFedAlign  # noqa: E402


class XFedAlignStrategy(FedAvg):
    """Flower's FedAvg for the task model plus xFedAlign's Global Explanation Prior.

    Args:
        algorithm: the ``core.XFedAlign`` whose settings (groups, k, noise, aggregation, beta) the run uses.
        min_replies: fewest successful replies a round needs to be aggregated (default: ``min_train_nodes``).
        **fedavg: passed to ``FedAvg`` (``fraction_train``, ``min_train_nodes``, ...); federated evaluation is
            off unless ``fraction_evaluate`` is given.

    Attributes:
        prior: the current (C, G) prior. history: per round, the partitions that answered, those that failed,
            and whether the round was aggregated.
    """

    def __init__(self, algorithm: XFedAlign, *, min_replies: int | None = None, **fedavg: Any):
        if not isinstance(algorithm, XFedAlign):
            raise TypeError(f"algorithm must be an XFedAlign, got {type(algorithm).__name__}")
        fedavg.setdefault("fraction_evaluate", 0.0)
        super().__init__(**fedavg)
        self.algorithm = algorithm
        self.min_replies = self.min_train_nodes if min_replies is None else int(min_replies)
        if self.min_replies < 1:
            raise ValueError(f"min_replies must be >= 1, got {min_replies!r}")
        self.state = algorithm.initial_state([])
        self.history: list[dict[str, Any]] = []

    @property
    def prior(self) -> np.ndarray:
        return self.state["prior"]

    def initial_arrays(self) -> ArrayRecord:
        """The task model's initial parameters (the same as the in-process runner's)."""
        return ArrayRecord({k: Array(v) for k, v in self.state["params"].items()})

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
                        ) -> Iterable[Message]:
        """FedAvg's messages, with the prior, beta and the run's seed in the train config."""
        extra = self.algorithm.extra_message(server_round, self.state)
        config["prior"] = np.ascontiguousarray(extra["prior"], dtype="<f4").tobytes()
        config["prior-shape"] = list(extra["prior"].shape)
        config["beta"] = float(extra["beta"])
        config["seed"] = int(self.algorithm.seed)
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """FedAvg over the successful replies (ordered by partition id), then the prior from their artifacts."""
        replies = list(replies)
        ok = [m for m in replies if not m.has_error()]
        failed = [m.metadata.src_node_id for m in replies if m.has_error()]
        ok.sort(key=lambda m: int(next(iter(m.content.metric_records.values()))["partition-id"]))
        answered = [int(next(iter(m.content.metric_records.values()))["partition-id"]) for m in ok]
        entry = {"round": server_round, "answered": answered, "failed_nodes": failed,
                 "aggregated": len(ok) >= self.min_replies}
        self.history.append(entry)
        if not entry["aggregated"]:
            return None, None
        payloads = [SparseArtifact.from_bytes(m.content["xfedalign"]["artifact"]).to_payload() for m in ok]
        arrays, metrics = super().aggregate_train(server_round, ok)
        self.state = self.algorithm.aggregate_explanations(server_round, self.state, payloads)
        if arrays is not None:
            self.state["params"] = {k: v.numpy() for k, v in arrays.items()}
        return arrays, metrics


def train_message_payload(content: RecordDict) -> dict[str, Any]:
    """A train message's content as the payload ``XFedAlign.client_step`` reads (parameters, prior, beta, seed)."""
    config = content["config"]
    shape = tuple(int(v) for v in config["prior-shape"])
    return {**{PARAM + k: v.numpy() for k, v in content["arrays"].items()},
            "prior": np.frombuffer(config["prior"], dtype="<f4").reshape(shape),
            "beta": float(config["beta"]), "seed": int(config["seed"])}


def reply_content(reply: dict[str, Any], partition_id: int) -> RecordDict:
    """A client's ``client_step`` reply as the content of its Flower reply (FedAvg's two records + the artifact)."""
    params = {k[len(PARAM):]: v for k, v in reply.items() if k.startswith(PARAM)}
    return RecordDict({
        "arrays": ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in params.items()}),
        "metrics": MetricRecord({"num-examples": int(reply["num_examples"]), "partition-id": int(partition_id)}),
        "xfedalign": ConfigRecord({"artifact": SparseArtifact.from_payload(reply).to_bytes()}),
    })


def client_app(algorithm: XFedAlign, load_client: Callable[[int], Any]) -> ClientApp:
    """A ``ClientApp`` whose ``@train`` runs ``algorithm.client_step`` on ``load_client(partition_id)``.

    Args:
        algorithm: the same ``XFedAlign`` the server's strategy holds.
        load_client: maps the node's ``partition-id`` to its ``data.ClientData`` (only its own data).
    """
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        cid = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        reply, _ = algorithm.client_step(load_client(cid), train_message_payload(msg.content), {}, rnd)
        return Message(content=reply_content(reply, cid), reply_to=msg)

    return app


def server_app(strategy: XFedAlignStrategy, *, timeout: float = 600.0, outcome: dict[str, Any] | None = None
               ) -> ServerApp:
    """A ``ServerApp`` running ``strategy`` for ``strategy.algorithm.rounds`` rounds; fills ``outcome``
    (``result``: Flower's ``Result``, ``error``: an exception raised on the server) when given."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            result = strategy.start(grid=grid, initial_arrays=strategy.initial_arrays(),
                                    num_rounds=strategy.algorithm.rounds, timeout=timeout)
            if outcome is not None:
                outcome["result"] = result
        except BaseException as exc:  # surfaced by run_flower_strategy
            if outcome is None:
                raise
            outcome["error"] = exc

    return app


def run_flower_strategy(algorithm: XFedAlign, client_data: Sequence[Any], *, min_replies: int | None = None,
                        timeout: float = 600.0, verbose: bool = False) -> dict[str, Any]:
    """Run xFedAlign as a Flower simulation (one SuperNode per entry of ``client_data``).

    Returns:
        ``{"params", "prior", "history"}``: the final global parameters, the prior and the strategy's record of
        answered and failed clients per round.
    """
    from flwr.simulation import run_simulation

    os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    n = len(client_data)
    if n == 0:
        raise ValueError("client_data must hold at least one client")
    strategy = XFedAlignStrategy(algorithm, min_train_nodes=n, min_available_nodes=n,
                                 min_replies=n if min_replies is None else min_replies)
    outcome: dict[str, Any] = {}
    backend = {"client_resources": {"num_cpus": 1}, "init_args": {"log_to_driver": verbose, "num_cpus": 2}}
    run_simulation(server_app=server_app(strategy, timeout=timeout, outcome=outcome),
                   client_app=client_app(algorithm, lambda cid: client_data[cid]),
                   num_supernodes=n, backend_config=backend, verbose_logging=verbose)
    if "error" in outcome:
        raise RuntimeError(f"the Flower run failed: {outcome['error']!r}") from outcome["error"]
    return {"params": dict(strategy.state["params"]), "prior": strategy.prior, "history": strategy.history}
