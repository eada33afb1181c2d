"""``FederatedIndependenceTest``: the federated HSIC test as an sklearn-style estimator, on the federation harness.

``fit(clients)`` takes a list of ``(X_k, Y_k)`` pairs (one per client; rows paired within a client) and runs the
test as a one-round federated query (``FedITQuery`` on ``icml26.common.federation``): the server broadcasts the
settings, every client aligns its marginals (rank transform), computes its within-client HSIC statistic and
null moments (or permuted statistics) and returns only those numbers, the server stacks them.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> clients = []
    >>> for k in range(4):   # client-specific marginals, dependent X and Y inside every client
    ...     x = 3 * k + rng.normal(size=60)
    ...     clients.append((x, np.exp(x - 3 * k) + 0.5 * rng.normal(size=60)))
    >>> test = FederatedIndependenceTest(random_state=0).fit(clients)
    >>> bool(test.reject_), test.n_clients_
    (True, 4)

Reference: "Powerful and Theoretically Guaranteed Independence Testing on Heterogeneous Federated Clients",
ICML 2026 (poster 62361) — reconstructed, see the README; A. Gretton et al., "A kernel statistical test of
independence", NeurIPS 2007; K. Zhang et al., "Kernel-based conditional independence test", UAI 2011.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator

from ..common.federation import FederatedAlgorithm, Payload, run_in_process
from .core import (
    ClientStatistics,
    aggregate,
    client_statistics,
    copula_transform,
    gaussian_sigma,
    median_heuristic,
    rank_statistic_sensitivity,
    uniform_median_bandwidth,
)

MIN_ROWS = 5
RUNNERS = ("in_process", "flower", "flower-deployment")


@dataclass(frozen=True)
class DP:
    """(epsilon, delta)-differential privacy for each client's released statistic."""

    epsilon: float
    delta: float = 1e-5

    def __post_init__(self) -> None:
        if not (isinstance(self.epsilon, (int, float)) and math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"epsilon must be a finite number > 0, got {self.epsilon!r}")
        if not (isinstance(self.delta, (int, float)) and 0 < self.delta < 1):
            raise ValueError(f"delta must be in (0, 1), got {self.delta!r}")


def check_clients(clients: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    """Validate ``[(X_k, Y_k), ...]``: 2-D float arrays (1-D becomes a column), paired rows, >= 5 rows, finite,
    no constant column; errors name the client and the problem."""
    if isinstance(clients, np.ndarray) or not isinstance(clients, (list, tuple)):
        raise TypeError(f"clients must be a list of (X, Y) pairs, got {type(clients).__name__}")
    if not clients:
        raise ValueError("clients must hold at least one (X, Y) pair")
    out = []
    for k, pair in enumerate(clients):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise TypeError(f"client {k}: expected an (X, Y) pair")
        arrays = []
        for name, A in zip("XY", pair, strict=True):
            A = np.asarray(A, dtype=np.float64)
            if A.ndim == 1:
                A = A[:, None]
            if A.ndim != 2:
                raise ValueError(f"client {k}: {name} must be 1-D or 2-D, got {A.ndim}-D")
            if not np.isfinite(A).all():
                raise ValueError(f"client {k}: {name} contains NaN or Inf")
            constant = [j for j in range(A.shape[1]) if np.ptp(A[:, j]) == 0] if A.shape[0] else []
            if constant:
                raise ValueError(f"client {k}: column(s) {constant} of {name} are constant")
            arrays.append(A)
        X, Y = arrays
        if X.shape[0] != Y.shape[0]:
            raise ValueError(f"client {k}: X has {X.shape[0]} rows but Y has {Y.shape[0]}")
        if X.shape[0] < MIN_ROWS:
            raise ValueError(f"client {k}: {X.shape[0]} rows, need at least {MIN_ROWS}")
        out.append((X, Y))
    widths = {(X.shape[1], Y.shape[1]) for X, Y in out}
    if len(widths) != 1:
        raise ValueError(f"all clients must have the same X and Y widths, got {sorted(widths)}")
    return out


def _ranks_random_ties(A: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Normalised ranks with ties broken at random (so they are a permutation of 1..n)."""
    n = A.shape[0]
    out = np.empty_like(A)
    for j in range(A.shape[1]):
        order = np.lexsort((rng.random(n), A[:, j]))
        out[order, j] = np.arange(1, n + 1)
    return out / (n + 1)


class FedITQuery(FederatedAlgorithm):
    """The test as a one-round federated query (runs on either harness runner)."""

    rounds = 1
    message_type = "query"

    def __init__(self, *, copula: bool, null: str, n_permutations: int, random_features: int | None,
                 privacy: DP | None, seed: int):
        self.copula, self.null, self.n_permutations = copula, null, n_permutations
        self.random_features, self.privacy, self.seed = random_features, privacy, seed

    def configure(self, rnd: int, state: Any, client_ids: list[int]) -> dict[int, Payload]:
        common = {"copula": self.copula, "permutations": self.n_permutations if self.null == "permutation" else 0,
                  "features": int(self.random_features or 0), "feature_seed": self.seed,
                  "epsilon": float(self.privacy.epsilon) if self.privacy else 0.0,
                  "delta": float(self.privacy.delta) if self.privacy else 0.0}
        # each client draws its own randomness (permutations, privacy noise) from its own seed
        return {cid: {**common, "client_seed": int(self.seed * 1_000_003 + cid)} for cid in client_ids}

    def client_step(self, data: tuple[np.ndarray, np.ndarray], message: Payload, state: dict, rnd: int
                    ) -> tuple[Payload, dict]:
        X, Y = data
        rng = np.random.default_rng(int(message["client_seed"]))
        private = float(message["epsilon"]) > 0
        if message["copula"]:
            # $$U = \mathrm{rank}(X)/(n+1)$$, V likewise: the client's marginals aligned to the uniform
            U, V = (_ranks_random_ties(X, rng), _ranks_random_ties(Y, rng)) if private else (
                copula_transform(X), copula_transform(Y))
            bx, by = uniform_median_bandwidth(X.shape[1]), uniform_median_bandwidth(Y.shape[1])
        else:
            U, V = X, Y
            bx, by = median_heuristic(X), median_heuristic(Y)
        stats = client_statistics(U, V, bx, by, n_permutations=int(message["permutations"]), rng=rng,
                                  random_features=int(message["features"]) or None,
                                  feature_seed=int(message["feature_seed"]))
        reply: Payload = {"n": stats.n, "statistic": stats.statistic, "null_mean": stats.null_mean,
                          "null_var": stats.null_var, "noise_var": 0.0}
        if private:
            sensitivity = rank_statistic_sensitivity(stats.n, bx, by, X.shape[1], Y.shape[1])
            sigma = gaussian_sigma(float(message["epsilon"]), float(message["delta"]), sensitivity)
            # Gaussian mechanism: R_k + N(0, sigma^2); sigma^2 joins the null variance at the server
            reply["statistic"] = stats.statistic + float(rng.normal(scale=sigma))
            reply["noise_var"] = sigma**2
        if stats.permuted is not None:
            reply["permuted"] = stats.permuted
        return reply, state

    def aggregate(self, rnd: int, state: Any, replies: dict[int, Payload]) -> Any:
        stats = [ClientStatistics(int(r["n"]), float(r["statistic"]), float(r["null_mean"]), float(r["null_var"]),
                                  r.get("permuted"), float(r["noise_var"])) for _, r in sorted(replies.items())]
        return stats, aggregate(stats, self.null)


class FederatedIndependenceTest(BaseEstimator):
    """Federated HSIC independence test that stays valid under client heterogeneity.

    Copula alignment (within-client ranks), stacked within-client statistics S = sum_k tr(K~_k L~_k), null by
    the gamma approximation (moments summed over clients) or within-client permutations, optional random
    Fourier features and (epsilon, delta)-DP noise (added to the null). H0: X and Y independent in every client.

    Args:
        null: ``"gamma"`` or ``"permutation"``.
        n_permutations: B for the permutation null.
        random_features: D random Fourier features (None: exact kernels).
        privacy: ``DP(epsilon, delta)`` or None. Needs the gamma null and 1-D X and Y (then the null moments
            are functions of n_k only and can be released without noise).
        copula: align marginals with within-client ranks (False: raw data with per-client median bandwidths,
            the ablation "stacked without alignment").
        alpha: level of ``reject_``.
        random_state: seed of the permutations, the features and the privacy noise.
        runner: ``"in_process"``, ``"flower"`` (the Flower App ``icml26.fedit.flower`` on Flower's simulation
            engine, through a local SuperLink and ``flwr run``) or ``"flower-deployment"`` (the same app on one
            SuperNode process per client); the Flower runners need the ``fl`` extra and take a minute.

    Attributes:
        statistic_, pvalue_, reject_, null_mean_, null_var_, n_clients_, client_statistics_ (what each client
        released), noise_std_ (per client, privacy), epsilon_, delta_.
    """

    def __init__(self, null: str = "gamma", n_permutations: int = 200, random_features: int | None = None,
                 privacy: DP | None = None, copula: bool = True, alpha: float = 0.05, random_state: int | None = None,
                 runner: str = "in_process"):
        self.null = null
        self.n_permutations = n_permutations
        self.random_features = random_features
        self.privacy = privacy
        self.copula = copula
        self.alpha = alpha
        self.random_state = random_state
        self.runner = runner

    def _check_settings(self) -> None:
        """The checks that need no data (also run by the Flower ServerApp on its run config)."""
        if self.null not in ("gamma", "permutation"):
            raise ValueError(f"null must be 'gamma' or 'permutation', got {self.null!r}")
        if self.null == "permutation" and (not isinstance(self.n_permutations, int) or self.n_permutations < 1):
            raise ValueError(f"n_permutations must be a positive int, got {self.n_permutations!r}")
        if self.random_features is not None and (not isinstance(self.random_features, int) or self.random_features < 1):
            raise ValueError(f"random_features must be None or a positive int, got {self.random_features!r}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha!r}")
        if self.runner not in RUNNERS:
            raise ValueError(f"runner must be one of {', '.join(map(repr, RUNNERS))}, got {self.runner!r}")
        if self.privacy is not None:
            if not isinstance(self.privacy, DP):
                raise TypeError(f"privacy must be a DP(epsilon, delta), got {type(self.privacy).__name__}")
            if self.null != "gamma":
                raise ValueError("privacy needs the gamma null: releasing B permuted statistics would cost B times "
                                 "the privacy budget")
            if not self.copula:
                raise ValueError("privacy needs copula=True (the sensitivity bound is for rank-transformed data)")

    def _check_params(self, clients: list[tuple[np.ndarray, np.ndarray]]) -> None:
        self._check_settings()
        if self.privacy is not None:
            X, Y = clients[0]
            if X.shape[1] != 1 or Y.shape[1] != 1:
                raise ValueError("privacy mode supports 1-D X and Y (only then are the null moments free of data)")

    def fit(self, clients: Any, y: Any = None) -> FederatedIndependenceTest:
        """Run the test on ``clients`` = ``[(X_1, Y_1), ..., (X_K, Y_K)]``."""
        data = check_clients(clients)
        self._check_params(data)
        seed = int(np.random.default_rng(self.random_state).integers(0, 2**31 - 1))
        query = FedITQuery(copula=self.copula, null=self.null, n_permutations=self.n_permutations,
                           random_features=self.random_features, privacy=self.privacy, seed=seed)
        if self.runner == "in_process":
            stats, result = run_in_process(query, data)
        else:  # the Flower App of flower.py through a local SuperLink: simulation or deployment engine
            from .flower import run_local

            engine = "simulation" if self.runner == "flower" else "deployment"
            stats, result = run_local(query, data, engine=engine).result
        self.client_statistics_ = stats
        self.statistic_, self.pvalue_ = result.statistic, result.pvalue
        self.null_mean_, self.null_var_ = result.null_mean, result.null_var
        self.reject_ = bool(self.pvalue_ < self.alpha)
        self.n_clients_ = len(data)
        self.noise_std_ = [math.sqrt(s.noise_var) for s in stats]
        self.epsilon_ = self.privacy.epsilon if self.privacy else math.inf
        self.delta_ = self.privacy.delta if self.privacy else 0.0
        return self
