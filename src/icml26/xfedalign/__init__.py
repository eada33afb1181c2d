"""xFedAlign: aligned, private explanations in federated learning.

Paper: "Explainable Federated Learning via Global-Local Attribution Alignment", ICML 2026 (poster 62427).
https://icml.cc/virtual/2026/poster/62427 -- official code: https://github.com/dawoodwasif/xFedAlign (MIT).

Task training stays FedAvg in parameter space; explanations are coordinated in a compact group space: each
client distils a sparse linear surrogate of its model and sends a clipped, noised, top-k, 8-bit artifact of a
few hundred bytes; the server aggregates a robust Global Explanation Prior that softly aligns local attributions.

``core`` holds the math and ``XFedAlign`` (a ``common.federation.FederatedAlgorithm``); ``server_app`` and
``client_app`` (``flower``: the harness's Flower apps, the ``fl`` extra; its App project is ``flower_app/``) run it
on Flower with ``flwr run``, ``run_local`` on a local SuperLink; ``explain`` computes attributions with Captum;
``metrics`` the one deletion / insertion, drift and membership-inference implementation every arm shares.
Not implemented: the paper's text task, its CNN and MNIST/CIFAR/AG-News/Adult data (no downloads; see the
README), the tabular sensitive-feature penalty of the official adult script.
"""

from __future__ import annotations

from typing import Any

from .core import (
    SparseArtifact,
    Surrogate,
    XFedAlign,
    aggregate_prior,
    align,
    distill_surrogate,
    jsd,
    make_artifact,
    sigma_for_epsilon,
    zcdp_epsilon,
)

_FLOWER = ("client_app", "drop_policy", "run_local", "server_app")
_STRATEGY = ("XFedAlignStrategy",)

__all__ = [
    "SparseArtifact", "Surrogate", "XFedAlign", "XFedAlignStrategy", "aggregate_prior", "align", "client_app", "distill_surrogate",
    "drop_policy", "jsd", "make_artifact", "run_local", "server_app", "sigma_for_epsilon", "zcdp_epsilon",
]


def __getattr__(name: str) -> Any:
    if name in _FLOWER:  # Flower is imported only when its adapter is asked for
        from . import flower

        return getattr(flower, name)
    if name in _STRATEGY:  # the Flower strategy for a user's own ServerApp (needs flwr)
        from . import strategy

        return getattr(strategy, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
