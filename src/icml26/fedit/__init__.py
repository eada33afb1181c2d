"""FedIT: federated independence testing under client heterogeneity.

Paper: "Powerful and Theoretically Guaranteed Independence Testing on Heterogeneous Federated Clients", ICML 2026
(poster 62361). https://icml.cc/virtual/2026/poster/62361

Existing federated independence tests lose validity or power when client marginals differ. A copula (rank)
transform inside each client aligns the marginals; a stacked, within-client-only HSIC statistic keeps each
client's dependence; gamma or permutation nulls, random-feature acceleration and a differentially private mode.

``federated_independence_test(client_xs, client_ys)`` (scipy.stats style: ``.statistic``, ``.pvalue``,
``.null_distribution``), ``FederatedIndependenceTest`` (sklearn-style; both run as a federated query on
``icml26.common.federation``, in process or on Flower) and ``core`` (the math: exact permutation null moments,
the private release of sqrt(R_k) with its proven sensitivity, the Gaussian accountant); ``icml26.fedit.flower`` (not imported here: it needs the extra) is
the Flower App (``ServerApp``/``ClientApp`` for ``flwr run``; its project folder is ``fedit/flower_app/``).
Reconstructed from the abstract and prior work: the paper's exact statistic, acceleration and privacy mechanism
are not available (see the README).
"""

from .core import (
    GaussianAccountant,
    aggregate,
    client_statistics,
    copula_transform,
    permutation_moments,
    root_statistic_sensitivity,
    uniform_median_bandwidth,
)
from .test import (
    DP,
    FederatedIndependenceTest,
    FedITQuery,
    FedITResult,
    check_clients,
    federated_independence_test,
)

__all__ = [
    "DP", "FedITQuery", "FedITResult", "FederatedIndependenceTest", "GaussianAccountant", "aggregate",
    "check_clients", "client_statistics", "copula_transform", "federated_independence_test",
    "permutation_moments", "root_statistic_sensitivity", "uniform_median_bandwidth",
]
