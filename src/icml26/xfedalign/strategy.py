r"""xFedAlign as a Flower strategy: ``XFedAlignStrategy``, a ``flwr.serverapp.strategy.FedAvg`` subclass that a user
puts in their own ``ServerApp``, and ``client_app``, a stock ``ClientApp`` (``@app.train()`` / ``@app.evaluate()``)
running the library's client step.

FedAvg of the task model, with the Global Explanation Prior beside it:

$$\theta \leftarrow \textstyle\sum_i \frac{n_i}{\sum_j n_j}\theta_i,\qquad
  \Pi \leftarrow \mathrm{rownorm}\big(e\,\Pi + (1 - e)\,\mathrm{median}_i\,S_i\big)$$

(S_i: client i's dequantised top-k artifact, over the clients whose presence bit for the class is on;
``core.aggregate_prior``). Each round:

- ``configure_train`` samples ``max(int(fraction_train * N), min_train_nodes)`` of the N connected nodes (after
  waiting for ``min_available_nodes``) and sends each ``"arrays"`` (the ``arrays`` of ``start()``, then the
  round's global model), ``"config"`` (the ``config`` of ``start()`` plus ``server-round`` and ``beta``) and
  ``"prior"`` (an ``ArrayRecord`` with the (C, G) prior, float32; a stock FedAvg client may ignore it);
- a client answers ``"arrays"`` (its parameters), a ``MetricRecord`` with ``num-examples`` and a ``ConfigRecord``
  holding ``artifact``: its ``SparseArtifact.to_bytes()`` (the wire format; no per-class counts);
- ``aggregate_train``: **failure policy**: a node that raised, sent a malformed reply (not one ``ArrayRecord``,
  other keys, NaN, no positive ``num-examples``, an artifact that does not parse or has another shape) or did not
  answer within ``start(timeout=...)`` is dropped and named in ``history``; with at least ``min_train_replies``
  usable replies the round is aggregated over them (nodes in id order, ``models.fedavg``), else it is skipped:
  model and prior unchanged (``(None, None)``). A class whose presence bit is off at every usable node takes
  every node's row (as ``core.XFedAlign``);
- ``Result.arrays`` is the global model; ``prior`` the final prior.

With every node answering, it computes the same parameters and prior as ``core.XFedAlign`` in
``common.federation.run_in_process`` (``tests/xfedalign/test_strategy_flower.py``). ``flower.py`` is the packaged
Flower App on the federation harness.

Example (inside a user's ``ServerApp``; see ``tests/xfedalign/test_strategy_flower.py``):
    >>> strategy = XFedAlignStrategy(n_classes=2, n_groups=10, fraction_train=0.5, beta=0.35)
    >>> strategy.prior.shape, strategy.prior[0, :3].tolist()
    ((2, 10), [0.1, 0.1, 0.1])
    >>> result = strategy.start(grid=grid, initial_arrays=ArrayRecord(params), num_rounds=5)  # doctest: +SKIP

Reference: xFedAlign (ICML 2026); the Message-API strategy interface of Flower 1.22+ (``FedAvg``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from logging import INFO, WARNING
from typing import Any

import numpy as np

from ..common.federation import SampledConfigure, check_count, check_fraction
from ..common.optional import requires

requires("flwr", extra="xfedalign", purpose="the Flower strategy of xFedAlign")

from flwr.app import (  # noqa: E402
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from flwr.supercore import log  # noqa: E402

from .core import AGGREGATIONS, PARAM, SparseArtifact, XFedAlign, aggregate_prior, params_of, uniform_prior  # noqa: E402


def artifact_of(reply: Message, key: str = "artifact") -> SparseArtifact:
    """The ``SparseArtifact`` in the reply's ``ConfigRecord`` field ``key`` (bytes)."""
    for record in reply.content.config_records.values():
        if key in record:
            return SparseArtifact.from_bytes(bytes(record[key]))
    raise KeyError(f"no ConfigRecord with '{key}' in the reply")


def present_of(artifact: SparseArtifact) -> np.ndarray:
    """(C,) whether the artifact's class rows enter the prior (its presence bits)."""
    bits = getattr(artifact, "present", None)
    return np.asarray(bits if bits is not None else np.asarray(artifact.counts) > 0, dtype=bool)


class XFedAlignStrategy(SampledConfigure, FedAvg):
    """FedAvg plus xFedAlign's Global Explanation Prior as a Flower strategy (see the module docstring).

    Args:
        n_classes, n_groups: the prior's shape (C, G); it starts uniform.
        fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, min_available_nodes,
            weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn:
            as Flower's ``FedAvg``.
        min_train_replies: the fewest usable train replies for a round to be aggregated (else it is skipped).
        aggregation, trim, ema: the prior's aggregation (``core.aggregate_prior``).
        beta: the alignment weight sent to the clients in the config, in [0, 1].
        prior_key: the message's ``ArrayRecord`` holding the prior (one array ``"prior"``).
        artifact_key: the reply's ``ConfigRecord`` field holding the artifact's bytes.
        seed: seed of the node sampling (None: a random one).

    Attributes:
        prior: the current (C, G) prior (float64, rows on the simplex).
        history: one dict per train round: ``sampled``, ``aggregated`` and ``failed`` (node -> why), ``skipped``.

    Raises:
        ValueError: a bad argument, named.
    """

    def __init__(self, n_classes: int, n_groups: int, fraction_train: float = 1.0, fraction_evaluate: float = 1.0,
                 min_train_nodes: int = 2, min_evaluate_nodes: int = 2, min_available_nodes: int = 2, *,
                 min_train_replies: int = 1, aggregation: str = "median", trim: float = 0.2, ema: float = 0.6,
                 beta: float = 0.35, weighted_by_key: str = "num-examples", arrayrecord_key: str = "arrays",
                 configrecord_key: str = "config", prior_key: str = "prior", artifact_key: str = "artifact",
                 train_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
                 evaluate_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
                 seed: int | None = None):
        self.n_classes = check_count("n_classes", n_classes, 1)
        self.n_groups = check_count("n_groups", n_groups, 1)
        fraction_train = check_fraction("fraction_train", fraction_train)
        fraction_evaluate = check_fraction("fraction_evaluate", fraction_evaluate)
        for name, value in (("min_train_nodes", min_train_nodes), ("min_evaluate_nodes", min_evaluate_nodes),
                            ("min_available_nodes", min_available_nodes)):
            check_count(name, value)
        self.min_train_replies = check_count("min_train_replies", min_train_replies, 1)
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
        for name, value, high in (("trim", trim, 0.5), ("ema", ema, 1.0)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < high:
                raise ValueError(f"{name} must be a number in [0, {high}), got {value!r}")
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 <= beta <= 1:
            raise ValueError(f"beta must be a number in [0, 1], got {beta!r}")
        for name, key in (("weighted_by_key", weighted_by_key), ("arrayrecord_key", arrayrecord_key),
                          ("configrecord_key", configrecord_key), ("prior_key", prior_key),
                          ("artifact_key", artifact_key)):
            if not isinstance(key, str) or not key:
                raise ValueError(f"{name} must be a non-empty str, got {key!r}")
        if len({arrayrecord_key, configrecord_key, prior_key}) < 3:
            raise ValueError("arrayrecord_key, configrecord_key and prior_key must differ")
        super().__init__(fraction_train=fraction_train, fraction_evaluate=fraction_evaluate,
                         min_train_nodes=min_train_nodes, min_evaluate_nodes=min_evaluate_nodes,
                         min_available_nodes=min_available_nodes, weighted_by_key=weighted_by_key,
                         arrayrecord_key=arrayrecord_key, configrecord_key=configrecord_key,
                         train_metrics_aggr_fn=train_metrics_aggr_fn, evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn)
        self.aggregation, self.trim, self.ema, self.beta = aggregation, float(trim), float(ema), float(beta)
        self.prior_key, self.artifact_key = prior_key, artifact_key
        self.rng = random.Random(seed)
        self.prior = uniform_prior(self.n_classes, self.n_groups)
        self.keys: list[str] | None = None
        self.history: list[dict[str, Any]] = []
        self._sampled: dict[tuple[str, int], list[int]] = {}

    @classmethod
    def from_algorithm(cls, algorithm: XFedAlign, **flower: Any) -> XFedAlignStrategy:
        """The strategy with ``algorithm``'s prior settings (shape, aggregation, trim, EMA, beta) and Flower's
        sampling arguments ``flower``."""
        if not isinstance(algorithm, XFedAlign):
            raise TypeError(f"algorithm must be an XFedAlign, got {type(algorithm).__name__}")
        a = algorithm
        return cls(**{**dict(n_classes=a.spec.n_classes, n_groups=a.groups.n_groups, aggregation=a.aggregation,
                             trim=a.trim, ema=a.ema, beta=a.beta), **flower})

    def summary(self) -> None:
        """Flower's FedAvg summary plus the prior's settings."""
        super().summary()
        log(INFO, "\t└──> xFedAlign: prior %s by %s, EMA %.3g, beta %.3g, at least %d replies per round",
            self.prior.shape, self.aggregation, self.ema, self.beta, self.min_train_replies)

    # -- messages -------------------------------------------------------------------------------------------
    def _messages(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, nodes: list[int],
                  message_type: str) -> list[Message]:
        """The round's messages (``common.federation.SampledConfigure`` samples the nodes): every node gets the
        global model, ``config`` (with ``beta``) and the prior."""
        config = ConfigRecord({**dict(config), "server-round": server_round, "beta": self.beta})  # start()'s, +
        prior = ArrayRecord({"prior": Array(np.ascontiguousarray(self.prior, dtype=np.float32))})
        return [Message(content=RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config,
                                            self.prior_key: prior}), message_type=message_type, dst_node_id=node)
                for node in nodes]


    # -- aggregation ----------------------------------------------------------------------------------------
    def problem(self, reply: Message) -> str | None:
        """Why a train reply cannot be aggregated (None: it can)."""
        if reply.has_error():
            return f"raised: {reply.error.reason}"
        content = reply.content
        if len(content.array_records) != 1:
            return f"expected one ArrayRecord, got {len(content.array_records)}"
        arrays = next(iter(content.array_records.values()))
        if self.keys is not None and set(arrays.keys()) != set(self.keys):
            return f"its arrays {sorted(set(arrays.keys()) ^ set(self.keys))[:3]} differ from the others'"
        if any(not np.all(np.isfinite(a.numpy())) for a in arrays.values()):
            return "its arrays hold NaN or Inf"
        weights = [m[self.weighted_by_key] for m in content.metric_records.values() if self.weighted_by_key in m]
        if len(weights) != 1 or isinstance(weights[0], list) or not (math.isfinite(weights[0]) and weights[0] > 0):
            return f"no positive '{self.weighted_by_key}' in its MetricRecord"
        try:
            art = artifact_of(reply, self.artifact_key)
        except (KeyError, ValueError, TypeError) as exc:
            return f"no readable artifact ({exc})"
        if (art.n_classes, art.n_groups) != (self.n_classes, self.n_groups):
            return f"its artifact is {(art.n_classes, art.n_groups)}, expected {(self.n_classes, self.n_groups)}"
        return None

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The failure policy, then FedAvg of the parameters and the prior from the artifacts."""
        from .models import fedavg

        usable: dict[int, Message] = {}
        failed: dict[int, str] = {}
        for reply in replies:
            why = self.problem(reply)
            if why is None:
                usable[reply.metadata.src_node_id] = reply
                if self.keys is None:
                    self.keys = list(next(iter(reply.content.array_records.values())).keys())
            else:
                failed[reply.metadata.src_node_id] = why
        sampled = self._sampled.get(("train", server_round), [])
        failed.update({n: "did not answer" for n in sampled if n not in usable and n not in failed})
        for node, why in sorted(failed.items()):
            log(WARNING, "train round %d: node %d dropped (%s)", server_round, node, why)
        nodes = sorted(usable)
        skipped = len(nodes) < self.min_train_replies
        self.history.append({"round": server_round, "sampled": sampled, "aggregated": nodes, "failed": failed,
                             "skipped": skipped})
        if skipped:
            log(WARNING, "aggregate_train: round %d skipped: %d usable replies, fewer than min_train_replies=%d",
                server_round, len(nodes), self.min_train_replies)
            return None, None
        contents = [usable[n].content for n in nodes]
        params = [{k: v.numpy() for k, v in next(iter(c.array_records.values())).items()} for c in contents]
        weights = [float(next(m[self.weighted_by_key] for m in c.metric_records.values()
                              if self.weighted_by_key in m)) for c in contents]
        # $$\theta = \sum_i n_i \theta_i / \sum_j n_j$$ (nodes in id order)
        theta = fedavg(params, weights)
        arts = [artifact_of(usable[n], self.artifact_key) for n in nodes]
        present = np.stack([present_of(a) for a in arts])
        present[:, ~present.any(axis=0)] = True  # a class no node reports takes every node's row (as core)
        # $$\Pi \leftarrow \mathrm{rownorm}(e\,\Pi + (1 - e)\,\mathrm{median}_i S_i)$$
        self.prior = aggregate_prior([a.dense() for a in arts], present=present, method=self.aggregation,
                                     trim=self.trim, prev=self.prior if self.ema > 0 else None, ema=self.ema)
        metrics = self.train_metrics_aggr_fn(contents, self.weighted_by_key)
        metrics["aggregated-nodes"] = len(nodes)
        metrics["failed-nodes"] = len(failed)
        metrics["explain-bytes"] = float(np.mean([a.nbytes for a in arts]))
        return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in theta.items()}), metrics

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Weighted mean of the replies' metrics; errors and replies without ``num-examples`` dropped."""
        usable = [r for r in replies if not r.has_error() and any(
            self.weighted_by_key in m for m in r.content.metric_records.values())]
        if not usable:
            return None
        usable.sort(key=lambda r: r.metadata.src_node_id)
        return self.evaluate_metrics_aggr_fn([r.content for r in usable], self.weighted_by_key)


# ------------------------------------------------------------------------------------------ a stock ClientApp
def client_app(algorithm: XFedAlign, load_client: Callable[[int], Any]) -> ClientApp:
    """A stock ``ClientApp`` (``@app.train()``, ``@app.evaluate()``) running ``algorithm.client_step`` on
    ``load_client(partition_id)``.

    train: local SGD from ``msg.content["arrays"]``, then the artifact of its updated model (seeded by the
    config's ``seed``, else the algorithm's, its cid and ``server-round``); answers ``{"arrays", "metrics":
    {"num-examples"}, "explanation": {"artifact": bytes}}``. evaluate: ``num-examples`` and ``accuracy`` of the
    received model on its test split.
    """
    from .models import predict_logits

    if not isinstance(algorithm, XFedAlign):
        raise TypeError(f"algorithm must be an XFedAlign, got {type(algorithm).__name__}")
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        data = load_client(int(context.node_config["partition-id"]))
        config = msg.content["config"]
        payload = {**{PARAM + k: v.numpy() for k, v in msg.content["arrays"].items()},
                   "seed": int(config.get("seed", algorithm.seed)), "beta": float(config.get("beta", algorithm.beta))}
        if "prior" in msg.content.array_records:
            payload["prior"] = msg.content["prior"]["prior"].numpy()
        reply, _ = algorithm.client_step(data, payload, {}, int(config["server-round"]))
        params = params_of(reply)
        return Message(RecordDict({
            "arrays": ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in params.items()}),
            "metrics": MetricRecord({"num-examples": int(reply["num_examples"])}),
            "explanation": ConfigRecord({"artifact": SparseArtifact.from_payload(reply).to_bytes()})}), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        data = load_client(int(context.node_config["partition-id"]))
        params = {k: v.numpy() for k, v in msg.content["arrays"].items()}
        pred = predict_logits(algorithm.spec, params, data.X_test).argmax(axis=1)
        return Message(RecordDict({"metrics": MetricRecord({
            "num-examples": len(data.y_test),
            "accuracy": float(np.mean(pred == data.y_test)) if len(data.y_test) else 0.0})}), reply_to=msg)

    return app
