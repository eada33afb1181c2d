r"""FedTreeLoRA as a Flower strategy: ``FedTreeLoRAStrategy``, a ``flwr.serverapp.strategy.FedAvg`` subclass that
a user puts in their own ``ServerApp``, and ``client_app``, a stock ``ClientApp`` (``@app.train()`` /
``@app.evaluate()``) running the library's LoRA trainer.

The strategy works on the ``ArrayRecord`` a stock ClientApp sends (its LoRA factors by their peft names,
``...layers.<l>...lora_A.weight`` / ``lora_B.weight``, and any other trainable arrays) and the ``num-examples``
of its ``MetricRecord``; it knows clients by their Flower node id, so no handshake is needed. Each round:

- ``configure_train`` samples ``max(int(fraction_train * N), min_train_nodes)`` of the N connected nodes (after
  waiting for ``min_available_nodes``) and sends **each its own** ``RecordDict``: ``"arrays"``: its personal
  starting point (a node never seen gets the ``arrays`` of ``start()`` / the last round's global arrays; during
  the warm-up a node gets back its own last LoRA factors; after the tree, its cluster expert of every layer),
  ``"config"``: the ``config`` of ``start()`` plus ``server-round``, and, after the tree, ``"external"``: its
  external experts (the average of the other clusters) for a client that mixes them in through a gate (a client
  that ignores them trains a cluster-only model). Arrays that are not LoRA factors are averaged over everyone;
- ``aggregate_train`` keeps the replies that arrived without error and are well formed (one ``ArrayRecord`` with
  the same keys as the others, finite values, a positive ``num-examples``); **failure policy**: a node that
  raised, sent a malformed reply or did not answer within ``start(timeout=...)`` is dropped from the round and
  named in ``history``; if at least ``min_train_replies`` replies remain the round is aggregated over them (a
  cluster expert averages every member's latest factors, so a member that missed the round counts with its last
  upload), else the round is skipped: personal models, tree and global arrays unchanged (``(None, None)``);
- after round ``warmup_rounds`` (the first round from it with >= 2 known nodes) it builds **one** client tree from
  the nodes' B factors and cuts it per layer (``core.build_client_tree``, ``select_layer_cuts``); then

  $$\bar A^{clus}_{l,k} = \textstyle\sum_{j \in S^{(l)}_k} w_j A_{l,j} / \sum_{j \in S^{(l)}_k} w_j,\quad
    \bar A^{ext}_{l,k} = \text{the same over the nodes outside } S^{(l)}_k$$

  (``core.aggregate_tree_lora``); nodes that first answer after the tree is built train from the global arrays;
- the global ``ArrayRecord`` (``Result.arrays``) is the ``num-examples``-weighted mean of the round's replies: for
  a layer cut into one cluster it is that layer's shared expert;
- ``configure_evaluate`` sends every sampled node its personal model; ``aggregate_evaluate`` averages the
  replies' metrics (weighted by ``num-examples``) and keeps each node's own in ``evaluations``.

With every node answering every round, it feeds a client the same inputs as ``core.FedTreeLoRA`` in
``common.federation.run_in_process`` (``tests/fedtreelora/test_strategy_flower.py`` checks per-client accuracies
and trees agree). ``flower.py`` is the packaged Flower App on the federation harness (every baseline arm).

Example (inside a user's ``ServerApp``; see ``tests/fedtreelora/test_strategy_flower.py``):
    >>> from flwr.app import ArrayRecord, ConfigRecord
    >>> strategy = FedTreeLoRAStrategy(fraction_train=0.5, min_train_nodes=2, warmup_rounds=2)
    >>> strategy.warmup_rounds, strategy.fraction_train
    (2, 0.5)
    >>> result = strategy.start(grid=grid, initial_arrays=ArrayRecord(init_lora), num_rounds=6,
    ...                         train_config=ConfigRecord({"lr": 0.01}))          # doctest: +SKIP

Reference: FedTreeLoRA, Bian, Wang, Zhang, Xu, ICML 2026 (arXiv:2603.13282); the Message-API strategy interface of
Flower 1.22+ (``flwr.serverapp.strategy.Strategy``, ``FedAvg``).
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

requires("flwr", extra="fedtreelora", purpose="the Flower strategy of FedTreeLoRA")

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

from .core import (  # noqa: E402
    CUT_RULES,
    DISTANCES,
    LINKAGES,
    FedTreeLoRA,
    _check_tau_window,
    aggregate_tree_lora,
    build_client_tree,
    factor_of,
    independent_partitions,
    layer_index,
    select_layer_cuts,
    tree_partitions,
    weighted_mean,
)


def is_lora_key(key: str) -> bool:
    """Whether ``key`` names a LoRA factor of a numbered layer (``...layers.3...lora_B.weight``)."""
    try:
        factor_of(key)
        layer_index(key)
    except ValueError:
        return False
    return True


def reply_problem(reply: Message, weighted_by_key: str, keys: Iterable[str] | None) -> str | None:
    """Why a train reply cannot be aggregated (None: it can): an error, not exactly one ``ArrayRecord``, other
    keys than ``keys``, non-finite values, or no positive ``weighted_by_key`` in its ``MetricRecord``."""
    if reply.has_error():
        return f"raised: {reply.error.reason}"
    content = reply.content
    if len(content.array_records) != 1:
        return f"expected one ArrayRecord, got {len(content.array_records)}"
    arrays = next(iter(content.array_records.values()))
    if keys is not None and set(arrays.keys()) != set(keys):
        return f"its arrays {sorted(set(arrays.keys()) ^ set(keys))[:3]} differ from the other replies'"
    if any(not np.all(np.isfinite(a.numpy())) for a in arrays.values()):
        return "its arrays hold NaN or Inf"
    weights = [m[weighted_by_key] for m in content.metric_records.values() if weighted_by_key in m]
    if len(weights) != 1 or isinstance(weights[0], list) or not (math.isfinite(weights[0]) and weights[0] > 0):
        return f"no positive '{weighted_by_key}' in its MetricRecord"
    return None


def arrays_of(reply: Message) -> dict[str, np.ndarray]:
    """The reply's one ``ArrayRecord`` as numpy arrays (in its order)."""
    return {k: v.numpy() for k, v in next(iter(reply.content.array_records.values())).items()}


def weight_of(reply: Message, key: str) -> float:
    """The reply's ``key`` (e.g. ``num-examples``) from its ``MetricRecord``."""
    return float(next(m[key] for m in reply.content.metric_records.values() if key in m))


class FedTreeLoRAStrategy(SampledConfigure, FedAvg):
    """FedTreeLoRA's per-layer tree aggregation as a Flower ``FedAvg``-style strategy (see the module docstring).

    Args:
        fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, min_available_nodes,
            weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn:
            as Flower's ``FedAvg``.
        min_train_replies: the fewest usable train replies for a round to be aggregated (else it is skipped).
        warmup_rounds: E_warm, rounds of local-only LoRA training before the tree (>= 1).
        tau, window, distance, linkage, cut_rule, fixed_k, external: the tree and its cuts (``core.FedTreeLoRA``).
        external_key: the message's ``ArrayRecord`` holding the external experts.
        seed: seed of the node sampling (None: a random one).

    Attributes:
        tree: after the warm-up, ``{"ids", "cuts", "partitions", "linkage", "layers"}`` (node ids).
        personal: node id -> ``{"clus": {key: array}, "ext": {key: array}}``, its next starting point.
        history: one dict per train round: ``sampled``, ``aggregated`` and ``failed`` (node -> why) nodes,
            ``skipped``.
        evaluations: round -> {node id: its evaluate MetricRecord as a dict}.

    Raises:
        ValueError: a bad argument, named.
    """

    def __init__(self, fraction_train: float = 1.0, fraction_evaluate: float = 1.0, min_train_nodes: int = 2,
                 min_evaluate_nodes: int = 2, min_available_nodes: int = 2, *, min_train_replies: int = 1,
                 warmup_rounds: int = 2, tau: float = 0.2, window: int = 3, distance: str = "cosine",
                 linkage: str = "average", cut_rule: str = "tree", fixed_k: int | None = None,
                 external: bool = True, weighted_by_key: str = "num-examples", arrayrecord_key: str = "arrays",
                 configrecord_key: str = "config", external_key: str = "external",
                 train_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
                 evaluate_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
                 seed: int | None = None):
        fraction_train = check_fraction("fraction_train", fraction_train)
        fraction_evaluate = check_fraction("fraction_evaluate", fraction_evaluate)
        for name, value in (("min_train_nodes", min_train_nodes), ("min_evaluate_nodes", min_evaluate_nodes),
                            ("min_available_nodes", min_available_nodes)):
            check_count(name, value)
        self.min_train_replies = check_count("min_train_replies", min_train_replies, 1)
        self.warmup_rounds = check_count("warmup_rounds", warmup_rounds, 1)
        if distance not in DISTANCES:
            raise ValueError(f"distance must be one of {DISTANCES}, got {distance!r}")
        if linkage not in LINKAGES:
            raise ValueError(f"linkage must be one of {LINKAGES}, got {linkage!r}")
        if cut_rule not in CUT_RULES:
            raise ValueError(f"cut_rule must be one of {CUT_RULES}, got {cut_rule!r}")
        if cut_rule == "fixed":
            check_count("fixed_k", fixed_k, 1)
        _check_tau_window(tau, window)
        for name, key in (("weighted_by_key", weighted_by_key), ("arrayrecord_key", arrayrecord_key),
                          ("configrecord_key", configrecord_key), ("external_key", external_key)):
            if not isinstance(key, str) or not key:
                raise ValueError(f"{name} must be a non-empty str, got {key!r}")
        if len({arrayrecord_key, configrecord_key, external_key}) < 3:
            raise ValueError("arrayrecord_key, configrecord_key and external_key must differ")
        super().__init__(fraction_train=fraction_train, fraction_evaluate=fraction_evaluate,
                         min_train_nodes=min_train_nodes, min_evaluate_nodes=min_evaluate_nodes,
                         min_available_nodes=min_available_nodes, weighted_by_key=weighted_by_key,
                         arrayrecord_key=arrayrecord_key, configrecord_key=configrecord_key,
                         train_metrics_aggr_fn=train_metrics_aggr_fn, evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn)
        self.tau, self.window, self.distance, self.linkage = float(tau), int(window), distance, linkage
        self.cut_rule, self.fixed_k, self.external, self.external_key = cut_rule, fixed_k, bool(external), external_key
        self.rng = random.Random(seed)
        self.keys: list[str] | None = None
        self.latest: dict[int, dict[str, np.ndarray]] = {}
        self.weights: dict[int, float] = {}
        self.tree: dict[str, Any] | None = None
        self.personal: dict[int, dict[str, dict[str, np.ndarray]]] = {}
        self.history: list[dict[str, Any]] = []
        self.evaluations: dict[int, dict[int, dict[str, Any]]] = {}
        self._sampled: dict[tuple[str, int], list[int]] = {}

    @classmethod
    def from_algorithm(cls, algorithm: FedTreeLoRA, **flower: Any) -> FedTreeLoRAStrategy:
        """The strategy with ``algorithm``'s tree settings (warm-up, tau, window, distance, linkage, cut rule,
        external experts) and Flower's sampling arguments ``flower``."""
        if not isinstance(algorithm, FedTreeLoRA):
            raise TypeError(f"algorithm must be a FedTreeLoRA, got {type(algorithm).__name__}")
        a = algorithm
        return cls(**{**dict(warmup_rounds=a.warmup_rounds, tau=a.tau, window=a.window, distance=a.distance,
                             linkage=a.linkage, cut_rule=a.cut_rule, fixed_k=a.fixed_k, external=a.external),
                      **flower})

    def summary(self) -> None:
        """Flower's FedAvg summary plus the tree settings."""
        super().summary()
        log(INFO, "\t└──> FedTreeLoRA: warm-up %d round(s), tau %.3g, window %d, %s/%s, cut rule %s, external %s, "
            "at least %d replies per round", self.warmup_rounds, self.tau, self.window, self.distance, self.linkage,
            self.cut_rule, self.external, self.min_train_replies)

    # -- messages -------------------------------------------------------------------------------------------
    def personal_arrays(self, node: int, arrays: ArrayRecord) -> tuple[ArrayRecord, ArrayRecord | None]:
        """(starting arrays, external experts or None) of ``node``: ``arrays`` with its personal LoRA factors."""
        mine = self.personal.get(node)
        if mine is None:
            return arrays, None
        out = {k: v for k, v in arrays.items() if k not in mine["clus"]}
        out.update({k: Array(np.ascontiguousarray(v)) for k, v in mine["clus"].items()})
        ext = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in mine["ext"].items()}) if mine["ext"] \
            else None
        return ArrayRecord(out), ext

    def _messages(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, nodes: list[int],
                  message_type: str) -> list[Message]:
        """The round's messages (``common.federation.SampledConfigure`` samples the nodes): each node gets its
        own starting arrays (and external experts) and ``config``; in evaluation, its personal model."""
        config = ConfigRecord({**dict(config), "server-round": server_round})  # start()'s config, with the round
        out = []
        for node in nodes:
            mine, ext = self.personal_arrays(node, arrays)
            record = RecordDict({self.arrayrecord_key: mine, self.configrecord_key: config})
            if ext is not None:
                record[self.external_key] = ext
            out.append(Message(content=record, message_type=message_type, dst_node_id=node))
        return out


    # -- aggregation ----------------------------------------------------------------------------------------
    def _usable(self, kind: str, server_round: int, replies: Iterable[Message], keys: list[str] | None
                ) -> tuple[dict[int, Message], dict[int, str]]:
        usable: dict[int, Message] = {}
        failed: dict[int, str] = {}
        for reply in replies:
            node = reply.metadata.src_node_id
            why = reply_problem(reply, self.weighted_by_key, keys) if kind == "train" else (
                f"raised: {reply.error.reason}" if reply.has_error() else None)
            if why is None and keys is None and kind == "train":
                keys = list(arrays_of(reply))
            if why is None:
                usable[node] = reply
            else:
                failed[node] = why
        for node in self._sampled.get((kind, server_round), []):
            if node not in usable and node not in failed:
                failed[node] = "did not answer"
        for node, why in sorted(failed.items()):
            log(WARNING, "%s round %d: node %d dropped (%s)", kind, server_round, node, why)
        return dict(sorted(usable.items())), failed

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The failure policy, then the tree (once, after the warm-up), every node's cluster and external experts,
        and the global weighted mean."""
        usable, failed = self._usable("train", server_round, replies, self.keys)
        entry = {"round": server_round, "sampled": self._sampled.get(("train", server_round), []),
                 "aggregated": sorted(usable), "failed": failed, "skipped": len(usable) < self.min_train_replies}
        self.history.append(entry)
        if entry["skipped"]:
            log(WARNING, "aggregate_train: round %d skipped: %d usable replies, fewer than min_train_replies=%d",
                server_round, len(usable), self.min_train_replies)
            return None, None
        uploads = {node: arrays_of(reply) for node, reply in usable.items()}
        if self.keys is None:
            self.keys = list(next(iter(uploads.values())))
        lora = [k for k in self.keys if is_lora_key(k)]
        for node, reply in usable.items():
            self.latest[node] = {k: uploads[node][k] for k in lora}
            self.weights[node] = weight_of(reply, self.weighted_by_key)
        known = sorted(self.latest)
        if self.tree is None and server_round >= self.warmup_rounds and len(known) >= 2 and lora:
            self.tree = self.build(known, lora)
        if self.tree is None:  # the warm-up: every node keeps its own factors
            for node in usable:
                self.personal[node] = {"clus": dict(self.latest[node]), "ext": {}}
        else:
            ids = self.tree["ids"]
            experts = aggregate_tree_lora({node: self.latest[node] for node in ids},
                                          dict(zip(self.tree["layers"], self.tree["partitions"], strict=True)),
                                          {node: self.weights[node] for node in ids}, external=self.external)
            self.personal.update({node: experts[node] for node in ids})
        nodes = list(usable)
        # $$\bar\theta = \sum_j n_j \theta_j / \sum_j n_j$$ over the round's usable replies (nodes in id order)
        mean = {k: weighted_mean([uploads[n][k] for n in nodes], [self.weights[n] for n in nodes])
                .astype(uploads[nodes[0]][k].dtype, copy=False) for k in self.keys}
        metrics = self.train_metrics_aggr_fn([usable[n].content for n in nodes], self.weighted_by_key)
        metrics["aggregated-nodes"] = len(nodes)
        metrics["failed-nodes"] = len(failed)
        return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in mean.items()}), metrics

    def build(self, ids: list[int], lora: list[str]) -> dict[str, Any]:
        """The client tree over ``ids`` from their latest B factors, and its per-layer cuts (``core``)."""
        layers = sorted({layer_index(k) for k in lora})
        B = {node: [[self.latest[node][k] for k in lora if factor_of(k) == "B" and layer_index(k) == layer]
                    for layer in layers] for node in ids}
        tree = build_client_tree(B, self.distance, self.linkage)
        if self.cut_rule == "tree":
            cuts = select_layer_cuts(tree, self.tau, self.window)
            partitions = tree_partitions(tree, cuts)
        elif self.cut_rule == "fixed":
            cuts = [min(self.fixed_k, len(ids))] * len(layers)
            partitions = tree_partitions(tree, cuts)
        else:
            cuts, partitions = independent_partitions(tree.layer_distances, tree.ids, self.tau, self.linkage)
        log(INFO, "FedTreeLoRA: client tree over %d nodes, clusters per layer %s", len(ids), list(cuts))
        return {"ids": list(ids), "layers": layers, "cuts": [int(c) for c in cuts], "partitions": partitions,
                "linkage": tree.linkage}

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Weighted mean of the replies' metrics (errors and silent nodes dropped); per-node in ``evaluations``."""
        usable, _ = self._usable("evaluate", server_round, replies, None)
        usable = {n: r for n, r in usable.items() if any(self.weighted_by_key in m for m in
                                                         r.content.metric_records.values())}
        if not usable:
            return None
        self.evaluations[server_round] = {n: {k: v for m in r.content.metric_records.values() for k, v in m.items()}
                                          for n, r in usable.items()}
        return self.evaluate_metrics_aggr_fn([r.content for r in usable.values()], self.weighted_by_key)


# ------------------------------------------------------------------------------------------ a stock ClientApp
def _gates(context: Context, algorithm: FedTreeLoRA) -> dict[str, float]:
    start = math.log(algorithm.gate_init / (1.0 - algorithm.gate_init))
    kept = context.state.metric_records.get("fedtreelora-gates")
    return {m: float(kept[m]) if kept is not None and m in kept else start for m in algorithm.modules}


def client_app(algorithm: FedTreeLoRA, load_client: Callable[[int], Any]) -> ClientApp:
    """A stock ``ClientApp`` (``@app.train()``, ``@app.evaluate()``) running ``algorithm.trainer`` on
    ``load_client(partition_id)``.

    train: loads ``msg.content["arrays"]`` (and ``"external"`` if sent), runs ``local-steps`` AdamW steps at
    ``lr`` (the message's config, else the algorithm's), keeps its gates in ``context.state``, and answers
    ``{"arrays": its LoRA factors, "metrics": {"num-examples"}}``. evaluate: answers ``num-examples`` (test items),
    ``val-accuracy`` and ``test-accuracy`` of its personalised model.
    """
    if not isinstance(algorithm, FedTreeLoRA):
        raise TypeError(f"algorithm must be a FedTreeLoRA, got {type(algorithm).__name__}")
    app = ClientApp()

    def inputs(msg: Message) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        arrays = msg.content["arrays"]
        clus = {k: arrays[k].numpy() for k in algorithm.keys}
        ext = {k: v.numpy() for k, v in msg.content["external"].items()} \
            if "external" in msg.content.array_records else {}
        return clus, ext

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        data = load_client(int(context.node_config["partition-id"]))
        config = msg.content["config"]
        clus, ext = inputs(msg)
        kwargs = algorithm.train_kwargs(data, int(config["server-round"]))
        kwargs.update(steps=int(config.get("local-steps", kwargs["steps"])), lr=float(config.get("lr", kwargs["lr"])))
        trained, mix = algorithm.trainer.train(data.train, clus, ext, _gates(context, algorithm), **kwargs)
        context.state["fedtreelora-gates"] = MetricRecord({m: float(v) for m, v in mix.items()})
        return Message(RecordDict({"arrays": ArrayRecord({k: Array(np.ascontiguousarray(trained[k]))
                                                          for k in algorithm.keys}),
                                   "metrics": MetricRecord({"num-examples": int(data.n_train)})}), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        data = load_client(int(context.node_config["partition-id"]))
        clus, ext = inputs(msg)
        mix = _gates(context, algorithm)
        val = algorithm.trainer.correct(data.val, clus, ext, mix)
        test = algorithm.trainer.correct(data.test, clus, ext, mix)
        return Message(RecordDict({"metrics": MetricRecord({
            "num-examples": len(test), "val-accuracy": float(np.mean(val)) if len(val) else 0.0,
            "test-accuracy": float(np.mean(test)) if len(test) else 0.0})}), reply_to=msg)

    return app
