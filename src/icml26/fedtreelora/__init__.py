"""FedTreeLoRA: tree-structured, layer-wise aggregation for federated LoRA.

Paper: "Reconciling Statistical and Functional Heterogeneity in Federated LoRA Fine-Tuning", Bian, Wang, Zhang,
Xu, ICML 2026 (poster 62499). https://arxiv.org/abs/2603.13282 (no official code).

After a local warm-up the server builds one client tree from the clients' LoRA B matrices and cuts it per
layer, shallow to deep, into non-decreasing, silhouette-chosen cluster counts (a shared trunk, specialised
branches); each client trains its cluster's average LoRA mixed with a frozen average of the others (learnable gate).

``core`` holds the tree, the cuts, the aggregation and ``FedTreeLoRA`` (a ``common.federation.FederatedAlgorithm``;
numpy / scipy / scikit-learn only); ``module`` the client's ``MixedLoRALinear`` (any ``transformers`` model,
peft key names, import from and export to peft); ``client`` local training; ``baselines`` FedAvg-, FFA-, FedSA-LoRA,
FedAvg + fine-tuning, Ditto, a fixed-depth split, flat clustering; ``flower`` is its Flower App on the federation
harness (``run_local``: ``flwr run`` on a local SuperLink) and ``FedTreeLoRAStrategy`` a personalised Flower
``Strategy`` (the ``fl`` extra).
Not implemented: the paper's RoBERTa/GLUE and LLaMA-2/FLAN setups (no downloads), an MoE-router variant, the
convergence analysis, rebuilding the tree during training.
"""

from __future__ import annotations

from typing import Any

from .baselines import (
    Ditto,
    FedAvgFT,
    FedAvgLoRA,
    FedSALoRA,
    FFALoRA,
    FixedDepthLoRA,
    FlatClusterLoRA,
    LocalLoRA,
    OracleClusterLoRA,
)
from .core import (
    ClientTree,
    FederatedLoRA,
    FedTreeLoRA,
    aggregate_tree_lora,
    build_client_tree,
    layer_distances,
    place_client,
    run_batched,
    select_layer_cuts,
    tree_partitions,
)

_FLOWER = ("FedTreeLoRAStrategy",)
_APP = ("run_local",)
_TORCH = ("MixedLoRALinear", "inject_mixed_lora", "to_peft_state_dict", "from_peft_state_dict", "from_peft_model",
          "export_peft", "LoRATrainer", "BatchedLoRATrainer")

__all__ = [
    "BatchedLoRATrainer",
    "ClientTree",
    "Ditto",
    "FFALoRA",
    "FedAvgFT",
    "FedAvgLoRA",
    "FedSALoRA",
    "FedTreeLoRA",
    "FedTreeLoRAStrategy",
    "FederatedLoRA",
    "FixedDepthLoRA",
    "FlatClusterLoRA",
    "LoRATrainer",
    "LocalLoRA",
    "MixedLoRALinear",
    "OracleClusterLoRA",
    "aggregate_tree_lora",
    "build_client_tree",
    "export_peft",
    "from_peft_model",
    "from_peft_state_dict",
    "inject_mixed_lora",
    "layer_distances",
    "place_client",
    "run_batched",
    "run_local",
    "select_layer_cuts",
    "to_peft_state_dict",
    "tree_partitions",
]


def __getattr__(name: str) -> Any:
    if name in _FLOWER:  # Flower is imported only when its adapter is asked for
        from . import strategy

        return getattr(strategy, name)
    if name in _APP:  # the Flower App (flwr run on a local SuperLink)
        from . import flower

        return getattr(flower, name)
    if name in _TORCH:  # torch modules load on first use
        from . import client, module

        return getattr(module, name, None) or getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
