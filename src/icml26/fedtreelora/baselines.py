r"""The paper's baselines on the same protocol, model, data and seeds (``core.FederatedLoRA``).

Every arm trains the same adapters (rank r on the same projections) with the same client trainer, rounds,
local steps and batches; only the server's sharing rule and the trainable factors differ:

==================  =====================================================================  ===================
arm                 sharing rule                                                           reference
==================  =====================================================================  ===================
``LocalLoRA``       nothing leaves a client                                                local-only
``FedAvgLoRA``      A and B averaged over all clients every round                          FedIT (Zhang 2024)
``FedAvgFT``        FedAvg, then the last ``ft_rounds`` rounds local fine-tuning only       FedAvg + FT
``FFALoRA``         A frozen at the shared initialisation, B averaged over all             FFA-LoRA (Sun 2024)
``FedSALoRA``       A averaged over all, B private                                         FedSA-LoRA (Guo 2025)
``Ditto``           FedAvg of the global adapters; each client also trains private          Ditto (Li 2021)
                    adapters pulled toward the global ones (lam), evaluated on those
``FixedDepthLoRA``  the first ``share_layers`` layers averaged over all, the rest private   FedPer-style split
``FlatClusterLoRA`` after the same warm-up, one silhouette-chosen cut of the client tree     FedLEASE-like, no
                    for every layer; cluster averages only                                   router
``OracleClusterLoRA`` the planted finest groups for every layer from round 1                 a reference, not a
                                                                                             method
==================  =====================================================================  ===================

FedAvg's aggregate is $$\bar A = \sum_k w_k A_k / \sum_k w_k,\ \bar B = \sum_k w_k B_k / \sum_k w_k$$ (A and B
averaged separately, w_k = training examples). Ditto's personal adapters minimise
$$h_k(v_k; w) = F_k(v_k) + \tfrac{\lambda}{2}\lVert v_k - w\rVert^2$$ (Li et al. 2021, eq. 2).

Example:
    >>> from icml26.fedtreelora.baselines import ARMS
    >>> sorted(ARMS)[:3]
    ['ditto', 'fedavg_ft', 'fedavg_lora']
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .core import (
    PERSONAL,
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


class FedAvgFT(FedAvgLoRA):
    """FedAvg followed by local fine-tuning: FedAvg for the first ``train_rounds - ft_rounds`` rounds, then each
    client fine-tunes the global adapters on its own data for the last ``ft_rounds`` rounds (nothing is sent)."""

    name = "fedavg_ft"

    def __init__(self, trainer: Any, *, ft_rounds: int, **kw: Any):
        super().__init__(trainer, **kw)
        if isinstance(ft_rounds, bool) or not isinstance(ft_rounds, int) or not 1 <= ft_rounds < self.train_rounds:
            raise ValueError(f"ft_rounds must be an int in [1, train_rounds), got {ft_rounds!r}")
        self.ft_rounds = ft_rounds

    def upload_keys(self, rnd: int) -> list[str]:
        return list(self.keys) if rnd <= self.train_rounds - self.ft_rounds else []

    def sharing(self, rnd, state, uploads):
        # round rnd's aggregate starts round rnd + 1: the last FedAvg round is train_rounds - ft_rounds
        if rnd > self.train_rounds - self.ft_rounds:
            return {}
        return super().sharing(rnd, state, uploads)


class Ditto(FedAvgLoRA):
    r"""Ditto (Li, Hu, Beirami, Smith, ICML 2021): FedAvg's global adapters w plus a private personal model v_k
    per client, pulled toward w; a client is evaluated with v_k.

    $$\min_{v_k}\ h_k(v_k; w^*) = F_k(v_k) + \frac{\lambda}{2}\lVert v_k - w^*\rVert^2$$  (paper eq. 2)

    Every training round t each client (a) trains the global adapters from the FedAvg aggregate w^t it received
    (round 1: ``trainer.init_state()``), ``local_steps`` AdamW steps, batch seed ``(seed, cid, t)``, and uploads
    them (bytes as FedAvg's: only w travels); (b) trains its personal adapters v_k from where it left them (round
    1: ``trainer.init_state()``), ``local_steps`` AdamW steps with the same ``lr`` on the loss plus the proximal
    term anchored at w^t, batch seed ``(seed, cid, t, 1)``, and keeps them (private state ``personal/<key>``).
    Algorithm 1's step $$v_k \leftarrow v_k - \eta\,(\nabla F_k(v_k) + \lambda (v_k - w^t))$$ is taken here by
    AdamW on that loss. A and B are both personal and both pulled.

    Args:
        trainer, train_rounds, local_steps, lr, seed: see ``FederatedLoRA``.
        lam: lambda >= 0, the pull of v_k toward w (0: v_k is local training; large: v_k stays at w^t).
    """

    name = "ditto"

    def __init__(self, trainer: Any, *, lam: float, **kw: Any):
        super().__init__(trainer, **kw)
        if isinstance(lam, bool) or not isinstance(lam, numbers.Real) or not math.isfinite(lam) or lam < 0:
            raise ValueError(f"lam must be a finite number >= 0, got {lam!r}")
        self.lam = float(lam)

    def personal_adapters(self, state: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """v_k: the client's personal adapters from its private state (``trainer.init_state()`` before round 1)."""
        v = {k: state.get(PERSONAL + k) for k in self.keys}
        if any(x is None for x in v.values()):
            return self.trainer.init_state()
        return {k: np.asarray(x) for k, x in v.items()}

    def personal_pass(self, data, rnd, message, state):
        w, _, mix = self.client_inputs(message, state)        # w^t: the global adapters this round starts from
        v = self.personal_adapters(state)
        # $$v_k \leftarrow v_k - \eta(\nabla F_k(v_k) + \lambda(v_k - w^t))$$ (Algorithm 1), by AdamW on F_k + h_k's term
        kwargs = {**self.train_kwargs(data, rnd), "seed": (self.seed, int(data.cid), rnd, 1), "prox": self.lam,
                  "anchor": w}
        return (v, {}, mix), kwargs

    def eval_inputs(self, message, state):
        _global, _, mix = self.client_inputs(message, state)
        return self.personal_adapters(state), {}, mix


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
                            "linkage": tree.linkage, "layer_distances": tree.layer_distances, "tree": tree, "B": B}
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
    "local": LocalLoRA, "fedavg_lora": FedAvgLoRA, "fedavg_ft": FedAvgFT, "ffa_lora": FFALoRA, "fedsa_lora": FedSALoRA,
    "ditto": Ditto, "fixed_depth": FixedDepthLoRA, "flat_cluster": FlatClusterLoRA, "oracle_cluster": OracleClusterLoRA,
}
