r"""The paper's baselines on the same protocol, model, data and seeds (``core.FederatedLoRA``).

Every arm trains the same adapters (rank r on the same projections) with the same client trainer, rounds,
local steps and batches; only the server's sharing rule and the trainable factors differ:

==================  =====================================================================  ===================
arm                 sharing rule                                                           reference
==================  =====================================================================  ===================
``LocalLoRA``       nothing leaves a client                                                local-only
``FedAvgLoRA``      A and B averaged over all clients every round                          FedIT (Zhang 2024)
``FFALoRA``         A frozen at the shared initialisation, B averaged over all             FFA-LoRA (Sun 2024)
``FedSALoRA``       A averaged over all, B private                                         FedSA-LoRA (Guo 2025)
``FixedDepthLoRA``  the first ``share_layers`` layers averaged over all, the rest private   FedPer-style split
``FlatClusterLoRA`` after the same warm-up, one silhouette-chosen cut of the client tree     FedLEASE-like, no
                    for every layer; cluster averages only                                   router
``OracleClusterLoRA`` the planted finest groups for every layer from round 1                 a reference, not a
                                                                                             method
==================  =====================================================================  ===================

FedAvg's aggregate is $$\bar A = \sum_k w_k A_k / \sum_k w_k,\ \bar B = \sum_k w_k B_k / \sum_k w_k$$ (A and B
averaged separately, w_k = training examples).

Example:
    >>> from icml26.fedtreelora.baselines import ARMS
    >>> sorted(ARMS)[:3]
    ['fedavg_lora', 'fedsa_lora', 'ffa_lora']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .core import (
    FederatedLoRA,
    _check_tau_window,
    build_client_tree,
    factor_of,
    flat_partition,
    labels_to_partition,
    layer_index,
)


class LocalLoRA(FederatedLoRA):
    """Local-only training: no upload, no aggregation."""

    name = "local"

    def upload_keys(self, rnd: int) -> list[str]:
        return []

    def sharing(self, rnd, state, uploads):
        return {}


class FedAvgLoRA(FederatedLoRA):
    """FedAvg over both LoRA factors (the paper's "FedIT")."""

    name = "fedavg_lora"

    def sharing(self, rnd, state, uploads):
        everyone = [frozenset(uploads)]
        return {layer: everyone for layer in self.layers}


class FFALoRA(FedAvgLoRA):
    """FFA-LoRA: A stays at the shared initialisation (never trained, never sent); B is trained and averaged."""

    name = "ffa_lora"
    train_A = False

    def upload_keys(self, rnd: int) -> list[str]:
        return [k for k in self.keys if factor_of(k) == "B"]

    def shared_factors(self) -> tuple[str, ...]:
        return ("B",)


class FedSALoRA(FedAvgLoRA):
    """FedSA-LoRA: A is shared (averaged over all clients), B stays private."""

    name = "fedsa_lora"

    def upload_keys(self, rnd: int) -> list[str]:
        return [k for k in self.keys if factor_of(k) == "A"]

    def shared_factors(self) -> tuple[str, ...]:
        return ("A",)


class FixedDepthLoRA(FederatedLoRA):
    """A fixed split (FedPer-style): the shallowest ``share_layers`` layers shared by all, deeper layers private."""

    name = "fixed_depth"

    def __init__(self, trainer: Any, *, share_layers: int, **kw: Any):
        super().__init__(trainer, **kw)
        if isinstance(share_layers, bool) or not isinstance(share_layers, int) or not 0 <= share_layers <= len(self.layers):
            raise ValueError(f"share_layers must be an int in [0, {len(self.layers)}], got {share_layers!r}")
        self.shared_layers = self.layers[:share_layers]

    def upload_keys(self, rnd: int) -> list[str]:
        return [k for k in self.keys if layer_index(k) in self.shared_layers]

    def sharing(self, rnd, state, uploads):
        everyone = [frozenset(uploads)]
        return {layer: everyone for layer in self.shared_layers}


class FlatClusterLoRA(FederatedLoRA):
    """Flat clustering: after the same warm-up as FedTreeLoRA, one partition (the silhouette-best cut of the
    same client tree on the layer-averaged distances) for every layer; cluster averages, no external expert."""

    name = "flat_cluster"

    def __init__(self, trainer: Any, *, warmup_rounds: int = 2, tau: float = 0.2, distance: str = "cosine",
                 linkage: str = "average", **kw: Any):
        super().__init__(trainer, **kw)
        if isinstance(warmup_rounds, bool) or not isinstance(warmup_rounds, int) or not 1 <= warmup_rounds < self.train_rounds:
            raise ValueError(f"warmup_rounds must be an int in [1, train_rounds), got {warmup_rounds!r}")
        _check_tau_window(tau, 1)
        self.warmup_rounds, self.tau, self.distance, self.linkage = warmup_rounds, float(tau), distance, linkage

    def upload_keys(self, rnd: int) -> list[str]:
        return [] if rnd < self.warmup_rounds else list(self.keys)

    def sharing(self, rnd, state, uploads):
        if rnd < self.warmup_rounds:
            return {}
        if rnd == self.warmup_rounds:
            ids = sorted(uploads)
            B = {cid: [[uploads[cid][k] for k in self.keys if factor_of(k) == "B" and layer_index(k) == layer]
                       for layer in self.layers] for cid in ids}
            tree = build_client_tree(B, self.distance, self.linkage)
            c, part = flat_partition(tree, self.tau)
            state["log"] = {"cuts": [c] * len(self.layers), "partitions": [part] * len(self.layers), "ids": ids,
                            "linkage": tree.linkage, "layer_distances": tree.layer_distances, "tree": tree}
        return dict(zip(self.layers, state["log"]["partitions"], strict=True))


class OracleClusterLoRA(FederatedLoRA):
    """The planted finest groups (clients with the same rule) share every layer from round 1: flat clustered
    federation that knows the clusters the methods must infer (a reference arm, not a method)."""

    name = "oracle_cluster"

    def __init__(self, trainer: Any, *, labels: Sequence[int], **kw: Any):
        super().__init__(trainer, **kw)
        self.labels = np.asarray(labels)

    def sharing(self, rnd, state, uploads):
        ids = sorted(uploads)
        if len(ids) != len(self.labels):
            raise ValueError(f"{len(self.labels)} planted labels for {len(ids)} clients")
        part = labels_to_partition(ids, self.labels)
        return {layer: part for layer in self.layers}


ARMS = {
    "local": LocalLoRA, "fedavg_lora": FedAvgLoRA, "ffa_lora": FFALoRA, "fedsa_lora": FedSALoRA,
    "fixed_depth": FixedDepthLoRA, "flat_cluster": FlatClusterLoRA, "oracle_cluster": OracleClusterLoRA,
}
