"""The paper's baselines on the same data, seeds and rounds, each training its own task model by FedAvg.

- **FedAvg** (BL-A): ``core.FedTrain``, no explanation channel.
- **Local-XAI** (BL-B): FedAvg's model, explained by each client with integrated gradients on its own data;
  nothing about explanations is shared (it is FedAvg plus ``explain.group_attributions`` at the client).
- **FedAttr-Agg** (BL-C): ``FedAttrAgg``: each client sends its per-class mean IG group maps (dense float32,
  C x G) of its updated model; the server takes their coordinate-wise median (no smoothing, as in the official
  code) and sends it back as a shared per-class map.
- **Fed-XAI** (BL-D): ``FedXAI``: the task model itself is an L1-regularised linear (softmax) model trained by
  FedAvg, explained intrinsically: per sample by its exact IG, W_c (x - x'), and globally by |W_c| pooled over
  each group.

Example:
    >>> from icml26.common.federation import run_in_process
    >>> from icml26.xfedalign.data import load_task
    >>> from icml26.xfedalign.models import ModelSpec
    >>> task = load_task("cancer", "iid", n_clients=3, seed=0)
    >>> out = run_in_process(FedXAI(ModelSpec(30, 2, 0), rounds=2, l1=2e-3), task.clients)
    >>> sorted(out["params"])
    ['0.bias', '0.weight']
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .core import FedTrain, aggregate_prior, normalize_rows, uniform_prior
from .data import GroupSpec


def class_mean_maps(maps: np.ndarray, labels: np.ndarray, n_classes: int, *, require_all: bool = False,
                    max_per_class: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-class means of per-sample (n, G) simplex maps, and the class counts used.

    Args:
        maps: (n, G) per-sample maps.
        labels: (n,) classes.
        n_classes: C.
        require_all: raise if a class has no sample (otherwise its row is uniform and its count 0).
        max_per_class: use at most this many samples of a class (the first ones).

    Raises:
        ValueError: ``require_all`` and a class without samples (the message names it).
    """
    maps, labels = np.asarray(maps, dtype=np.float64), np.asarray(labels)
    if maps.ndim != 2 or len(maps) != len(labels):
        raise ValueError(f"maps must be (n, G) with one label per row, got {maps.shape} and {labels.shape}")
    out = np.zeros((n_classes, maps.shape[1]))
    counts = np.zeros(n_classes, dtype=np.int64)
    for c in range(n_classes):
        rows = np.flatnonzero(labels == c)[:max_per_class]
        if len(rows) == 0:
            if require_all:
                raise ValueError(f"no samples of class {c}: its per-class map cannot be formed")
            continue
        out[c], counts[c] = maps[rows].mean(0), len(rows)
    return normalize_rows(out), counts


class FedAttrAgg(FedTrain):
    """FedAttr-Agg: dense per-class IG maps from every client, median-aggregated by the server.

    Args:
        spec, rounds, lr, ...: FedAvg settings (``core.FedTrain``).
        groups: the feature groups.
        baseline: IG's reference input (the training mean).
        n_steps: IG points (official code: 10).
        max_per_class: samples per class a client explains (official code: 30-40).
        last_round_only: compute the maps only in the last round. The prior is the last round's median (no
            smoothing), so this changes no result; the bytes are still counted in every round.
    """

    sends_prior = True

    def __init__(self, spec: Any, groups: GroupSpec, baseline: np.ndarray, *, n_steps: int = 10,
                 max_per_class: int = 40, last_round_only: bool = False, **fedavg: Any):
        super().__init__(spec, **fedavg)
        if groups.n_features != spec.n_features:
            raise ValueError(f"the groups cover {groups.n_features} features but the model has {spec.n_features}")
        self.groups, self.baseline = groups, np.asarray(baseline, dtype=np.float32)
        self.n_steps, self.max_per_class, self.last_round_only = n_steps, max_per_class, last_round_only

    def initial_state(self, client_ids):
        state = super().initial_state(client_ids)
        state["prior"] = uniform_prior(self.spec.n_classes, self.groups.n_groups)
        return state

    def explain(self, data: Any, params: dict[str, np.ndarray], message: dict[str, Any], rnd: int
                ) -> dict[str, Any]:
        from .explain import group_attributions, local_maps

        if self.last_round_only and rnd < self.rounds:
            return {}
        y = np.asarray(data.y_train)
        rows = np.concatenate([np.flatnonzero(y == c)[:self.max_per_class] for c in range(self.spec.n_classes)])
        rows.sort()
        pooled, _ = group_attributions(self.spec, params, data.X_train[rows], self.baseline, self.groups,
                                       n_steps=self.n_steps, target=y[rows])
        maps, counts = class_mean_maps(local_maps(pooled), y[rows], self.spec.n_classes)
        return {"attr_maps": maps.astype(np.float32), "attr_counts": counts}

    def explain_bytes(self, reply: dict[str, Any]) -> int:
        return 4 * self.spec.n_classes * self.groups.n_groups + 2 * self.spec.n_classes

    def aggregate_explanations(self, rnd, state, replies):
        if "attr_maps" not in replies[0]:
            return state
        prior = aggregate_prior([r["attr_maps"] for r in replies], present=[r["attr_counts"] > 0 for r in replies],
                                method="median")
        return {**state, "prior": prior}


class FedXAI(FedTrain):
    """Fed-XAI: a federated sparse linear model is the task model (official L1: 6e-4 MNIST, 2e-3 tabular)."""

    def __init__(self, spec: Any, *, l1: float = 6e-4, **fedavg: Any):
        if spec.hidden != 0:
            raise ValueError(f"Fed-XAI's task model is linear: spec.hidden must be 0, got {spec.hidden}")
        super().__init__(spec, l1=l1, **fedavg)


def linear_group_prior(params: dict[str, np.ndarray], groups: GroupSpec) -> np.ndarray:
    """Fed-XAI's global per-class map: rownorm(sum_{j in g} |W_cj|) of its linear model."""
    return normalize_rows(np.abs(np.asarray(params["0.weight"], dtype=np.float64)) @ groups.matrix())
