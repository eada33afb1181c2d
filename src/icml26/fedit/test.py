"""The federated HSIC test as scipy.stats users call one, and as an sklearn-style estimator.

``federated_independence_test(client_xs, client_ys, ...)`` returns a result with ``.statistic``, ``.pvalue`` and
``.null_distribution`` (like ``scipy.stats.permutation_test``; it also unpacks as ``statistic, pvalue``);
``FederatedIndependenceTest().fit([(X_1, Y_1), ...])`` is the same test as an estimator. Both run it as a
one-round federated query (``FedITQuery`` on ``icml26.common.federation``): the server broadcasts the settings,
every client aligns its marginals (rank transform), computes its within-client HSIC statistic R_k and its exact
permutation null moments (or permuted statistics) and returns only those numbers, the server stacks them. In
private mode a client returns only n_k and sqrt(R_k) + Gaussian noise (``core.root_statistic_sensitivity``).

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> xs, ys = [], []
    >>> for k in range(4):   # client-specific marginals, dependent X and Y inside every client
    ...     x = 3 * k + rng.normal(size=60)
    ...     xs.append(x); ys.append(np.exp(x - 3 * k) + 0.5 * rng.normal(size=60))
    >>> res = federated_independence_test(xs, ys, random_state=0)
    >>> bool(res.pvalue < 0.05), res.null, round(float(res.null_distribution.mean()), 6) == round(res.null_mean, 6)
    (True, 'gamma', True)
    >>> statistic, pvalue = res
    >>> test = FederatedIndependenceTest(random_state=0).fit(list(zip(xs, ys)))
    >>> bool(test.reject_), test.n_clients_, test.pvalue_ == pvalue
    (True, 4, True)

Reference: "Powerful and Theoretically Guaranteed Independence Testing on Heterogeneous Federated Clients",
ICML 2026 (poster 62361) — reconstructed, see the README; A. Gretton et al., "A kernel statistical test of
independence", NeurIPS 2007; K. Zhang et al., "Kernel-based conditional independence test", UAI 2011.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.stats
from sklearn.base import BaseEstimator

from ..common.federation import FailurePolicy, FederatedAlgorithm, Payload, run_flower_app, run_in_process
from .core import (
    ClientStatistics,
    GaussianAccountant,
    TestResult,
    aggregate,
    client_statistics,
    copula_transform,
    gaussian_sigma,
    grid_null_moments,
    median_heuristic,
    root_statistic,
    root_statistic_sensitivity,
    uniform_median_bandwidth,
)

MIN_ROWS = 5
"""Fewest rows a client may have, from measurement (the ``gamma_n*`` table of the full reproduction: the level of
the exact-moment gamma null by client size and number of clients, and the validity panel with 50 clients of 6
rows): stacked clients of 4 to 8 rows keep the level near alpha, but a lone client of 4 rows (24 permutations,
a coarse null) over-rejects clearly, while from 5 rows a lone client stays at or just under alpha + 0.02."""
RUNNERS = ("in_process", "flower", "flower-deployment")
APP_DIR = Path(__file__).with_name("flower_app")
"""The Flower App project (``flwr run`` takes this folder; ``flower.py`` builds its apps)."""
PRIVATE_NULL_DRAWS = 20_000
"""Monte Carlo draws of the private null (p-value resolution 1 / 20,001)."""


@dataclass(frozen=True)
class DP:
    """(epsilon, delta)-differential privacy for each client's released statistic (replace-one neighbours)."""

    epsilon: float
    delta: float = 1e-5

    def __post_init__(self) -> None:
        if not (isinstance(self.epsilon, (int, float)) and math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"epsilon must be a finite number > 0, got {self.epsilon!r}")
        if not (isinstance(self.delta, (int, float)) and 0 < self.delta < 1):
            raise ValueError(f"delta must be in (0, 1), got {self.delta!r}")


def check_clients(clients: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    """Validate ``[(X_k, Y_k), ...]``: 2-D float arrays (1-D becomes a column), paired rows, >= ``MIN_ROWS``
    rows, finite, no constant column; errors name the client and the problem."""
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


def private_noise(n: int, privacy: DP, random_features: int | None, feature_seed: int) -> tuple[float, float]:
    """(sensitivity of sqrt(R_k), noise standard deviation) of a private client of n rows (1-D, copula scale)."""
    b = uniform_median_bandwidth(1)
    sensitivity = root_statistic_sensitivity(n, b, b, random_features, feature_seed)
    return sensitivity, gaussian_sigma(privacy.epsilon, privacy.delta, sensitivity)


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
        # each client draws its own randomness (permutations, tie-breaking, privacy noise) from its own seed
        return {cid: {**common, "client_seed": int(self.seed * 1_000_003 + cid)} for cid in client_ids}

    def client_step(self, data: tuple[np.ndarray, np.ndarray], message: Payload, state: dict, rnd: int
                    ) -> tuple[Payload, dict]:
        X, Y = data
        private, permutations = float(message["epsilon"]) > 0, int(message["permutations"])
        rng = np.random.default_rng(int(message["client_seed"])) if private or permutations else None
        features = int(message["features"]) or None
        if private:
            if not message["copula"] or X.shape[1] != 1 or Y.shape[1] != 1:
                raise ValueError("privacy mode supports 1-D X and Y on the copula scale")
            # ties broken at random: U and V are permutations of the grid {1..n}/(n+1)
            U, V = copula_transform(X, rng=rng), copula_transform(Y, rng=rng)
            b = uniform_median_bandwidth(1)
            privacy = DP(float(message["epsilon"]), float(message["delta"]))
            _, sigma = private_noise(X.shape[0], privacy, features, int(message["feature_seed"]))
            root = root_statistic(U, V, b, b, features, int(message["feature_seed"]))
            # Gaussian mechanism on the root: $$\sqrt{R_k} + \mathcal N(0, \sigma_k^2)$$; only n and this leave
            return {"n": X.shape[0], "statistic": root + float(rng.normal(scale=sigma))}, state
        if message["copula"]:
            # $$U = \mathrm{rank}(X)/(n+1)$$, V likewise: the client's marginals aligned to the uniform
            U, V = copula_transform(X), copula_transform(Y)
            bx, by = uniform_median_bandwidth(X.shape[1]), uniform_median_bandwidth(Y.shape[1])
        else:
            U, V = X, Y
            bx, by = median_heuristic(X), median_heuristic(Y)
        stats = client_statistics(U, V, bx, by, n_permutations=permutations, rng=rng,
                                  random_features=features, feature_seed=int(message["feature_seed"]))
        reply: Payload = {"n": stats.n, "statistic": stats.statistic, "null_mean": stats.null_mean,
                          "null_var": stats.null_var, "noise_var": 0.0}
        if stats.permuted is not None:
            reply["permuted"] = stats.permuted
        return reply, state

    def aggregate(self, rnd: int, state: Any, replies: dict[int, Payload]) -> Any:
        ordered = [r for _, r in sorted(replies.items())]
        if self.privacy is None:
            stats = [ClientStatistics(int(r["n"]), float(r["statistic"]), float(r["null_mean"]),
                                      float(r["null_var"]), r.get("permuted"), float(r["noise_var"]))
                     for r in ordered]
            return stats, aggregate(stats, self.null)
        # private: the server derives each client's null moments and noise from n alone (data-free)
        stats = []
        for r in ordered:
            n = int(r["n"])
            b = uniform_median_bandwidth(1)
            mean, var = grid_null_moments(n, b, b, self.random_features, self.seed)
            _, sigma = private_noise(n, self.privacy, self.random_features, self.seed)
            stats.append(ClientStatistics(n, float(r["statistic"]), mean, var, None, sigma**2))
        rng = np.random.default_rng([int(self.seed), 0x5EED])
        return stats, aggregate(stats, "private", draws=PRIVATE_NULL_DRAWS, rng=rng)


@dataclass(frozen=True)
class FedITResult:
    """The outcome of ``federated_independence_test`` (unpacks as ``statistic, pvalue``, as scipy's results do).

    Attributes:
        statistic: S = sum_k R_k (private: the sum of the released noisy sqrt(R_k)).
        pvalue: P(S_null >= S).
        null_distribution: the null of S: a frozen ``scipy.stats.gamma`` (gamma null; ``.sf``, ``.ppf``,
            ``.rvs``), or an array of samples (the B permuted stacked statistics; the private Monte Carlo draws).
        null: ``"gamma"``, ``"permutation"`` or ``"private"``.
        null_mean, null_var: moments of that null.
        client_statistics: what the server knows of each client (``core.ClientStatistics``).
        epsilon, delta: the privacy spent per record by the accountant (``inf, 0`` without privacy).
        noise_std: per client, the standard deviation of the privacy noise (0 without privacy).
    """

    statistic: float
    pvalue: float
    null_distribution: Any
    null: str
    null_mean: float
    null_var: float
    client_statistics: list[ClientStatistics] = field(repr=False)
    epsilon: float = math.inf
    delta: float = 0.0
    noise_std: tuple[float, ...] = ()

    @property
    def n_clients(self) -> int:
        return len(self.client_statistics)

    def __iter__(self) -> Iterator[float]:
        return iter((self.statistic, self.pvalue))


def _settings_error(null: str, n_permutations: Any, random_features: Any, privacy: Any, copula: bool,
                    runner: str) -> None:
    if null not in ("gamma", "permutation"):
        raise ValueError(f"null must be 'gamma' or 'permutation', got {null!r}")
    if null == "permutation" and (not isinstance(n_permutations, int) or n_permutations < 1):
        raise ValueError(f"n_permutations must be a positive int, got {n_permutations!r}")
    if random_features is not None and (not isinstance(random_features, int) or random_features < 1):
        raise ValueError(f"random_features must be None or a positive int, got {random_features!r}")
    if runner not in RUNNERS:
        raise ValueError(f"runner must be one of {', '.join(map(repr, RUNNERS))}, got {runner!r}")
    if privacy is not None:
        if not isinstance(privacy, DP):
            raise TypeError(f"privacy must be a DP(epsilon, delta), got {type(privacy).__name__}")
        if null != "gamma":
            raise ValueError("privacy needs the gamma null: releasing B permuted statistics would cost B times "
                             "the privacy budget")
        if not copula:
            raise ValueError("privacy needs copula=True (the sensitivity bound is for rank-transformed data)")


def _run(data: list[tuple[np.ndarray, np.ndarray]], *, null: str, n_permutations: int,
         random_features: int | None, privacy: DP | None, copula: bool, random_state: Any, runner: str
         ) -> FedITResult:
    """Validate the settings against the data, run the query on ``runner``, wrap the result."""
    _settings_error(null, n_permutations, random_features, privacy, copula, runner)
    if privacy is not None and (data[0][0].shape[1] != 1 or data[0][1].shape[1] != 1):
        raise ValueError("privacy mode supports 1-D X and Y (only then are the ranks a permutation of a fixed "
                         "grid, which the sensitivity bound and the data-free null moments need)")
    seed = int(np.random.default_rng(random_state).integers(0, 2**31 - 1))
    query = FedITQuery(copula=copula, null=null, n_permutations=n_permutations, random_features=random_features,
                       privacy=privacy, seed=seed)
    if runner == "in_process":
        stats, result = run_in_process(query, data)
    else:  # the Flower App (flower_app/, whose apps flower.py builds) on a local SuperLink
        engine = "simulation" if runner == "flower" else "deployment"
        stats, result = run_flower_app(APP_DIR, run_config_of(query, len(data)), data, write_client, engine=engine,
                                       prefix="icml26-fedit-").result
    return wrap_result(stats, result, privacy, random_features, seed)


def wrap_result(stats: list[ClientStatistics], result: TestResult, privacy: DP | None = None,
                random_features: int | None = None, seed: int = 0) -> FedITResult:
    """A ``FedITResult`` from the query's ``(client statistics, TestResult)`` (accountant included)."""
    params = result.gamma_parameters
    null_distribution = (scipy.stats.gamma(params[0], scale=params[1]) if params is not None
                         else result.null_samples)
    epsilon, delta = math.inf, 0.0
    if privacy is not None:
        spent = []
        for s in stats:
            accountant = GaussianAccountant()
            accountant.compose(private_noise(s.n, privacy, random_features, seed)[0], math.sqrt(s.noise_var))
            spent.append(accountant.epsilon(privacy.delta))
        # every record belongs to one client, which released once: the largest per-client epsilon
        epsilon, delta = max(spent), privacy.delta
    return FedITResult(result.statistic, result.pvalue, null_distribution, result.null, result.null_mean,
                       result.null_var, list(stats), epsilon, delta, tuple(math.sqrt(s.noise_var) for s in stats))


def federated_independence_test(client_xs: Any, client_ys: Any, *, null: str = "gamma", n_permutations: int = 200,
                                random_features: int | None = None, privacy: DP | None = None,
                                copula: bool = True, random_state: Any = None, runner: str = "in_process"
                                ) -> FedITResult:
    """Federated HSIC independence test of X and Y over clients whose marginals may differ.

    Each client rank-transforms its own data (copula alignment) and returns R_k = tr(K~_k L~_k) with its exact
    within-client permutation mean and variance; the server tests S = sum_k R_k against the gamma with the summed
    moments, or against the sum of the clients' permuted statistics. H0: X and Y independent within every client.

    Args:
        client_xs: one (n_k,) or (n_k, d_x) array per client.
        client_ys: one (n_k,) or (n_k, d_y) array per client, rows paired with ``client_xs``.
        null: ``"gamma"`` (exact-moment gamma) or ``"permutation"`` (B within-client permutations).
        n_permutations: B of the permutation null.
        random_features: D random Fourier features (None: exact kernels).
        privacy: ``DP(epsilon, delta)`` (1-D X and Y, gamma null): clients release sqrt(R_k) + Gaussian noise
            and the null is a Monte Carlo draw of the noisy sum.
        copula: rank-align the marginals (False: raw data, per-client median-heuristic bandwidths).
        random_state: seed of the permutations, features, tie-breaking, noise and Monte Carlo null.
        runner: ``"in_process"``, ``"flower"`` or ``"flower-deployment"`` (the Flower App, ``fl`` extra).

    Returns:
        ``FedITResult`` with ``statistic``, ``pvalue``, ``null_distribution`` (and more).

    Example:
        >>> rng = np.random.default_rng(1)
        >>> xs = [rng.normal(size=8) + k for k in range(20)]     # 20 small clients, shifted marginals
        >>> ys = [rng.normal(size=8) - k for k in range(20)]     # independent of X
        >>> res = federated_independence_test(xs, ys)
        >>> bool(res.pvalue > 0.05), res.n_clients
        (True, 20)
    """
    for name, value in (("client_xs", client_xs), ("client_ys", client_ys)):
        if isinstance(value, (np.ndarray, str)) or not isinstance(value, (list, tuple)):
            raise TypeError(f"{name} must be a list with one array per client, got {type(value).__name__}")
    if len(client_xs) != len(client_ys):
        raise ValueError(f"client_xs has {len(client_xs)} clients but client_ys has {len(client_ys)}")
    data = check_clients(list(zip(client_xs, client_ys, strict=True)))
    return _run(data, null=null, n_permutations=n_permutations, random_features=random_features, privacy=privacy,
                copula=copula, random_state=random_state, runner=runner)


class FederatedIndependenceTest(BaseEstimator):
    """Federated HSIC independence test that stays valid under client heterogeneity (the estimator form of
    ``federated_independence_test``).

    Copula alignment (within-client ranks), stacked within-client statistics S = sum_k tr(K~_k L~_k), null by
    the gamma with exact permutation moments (summed over clients) or within-client permutations, optional
    random Fourier features and (epsilon, delta)-DP release of sqrt(R_k). H0: X and Y independent in every client.

    Args:
        null: ``"gamma"`` or ``"permutation"``.
        n_permutations: B for the permutation null.
        random_features: D random Fourier features (None: exact kernels).
        privacy: ``DP(epsilon, delta)`` or None. Needs the gamma null and 1-D X and Y; the test is then the
            private one (``null_ == "private"``).
        copula: align marginals with within-client ranks (False: raw data with per-client median bandwidths,
            the ablation "stacked without alignment").
        alpha: level of ``reject_``.
        random_state: seed of the permutations, the features and the privacy noise.
        runner: ``"in_process"``, ``"flower"`` (the Flower App ``icml26.fedit.flower`` on Flower's simulation
            engine, through a local SuperLink and ``flwr run``) or ``"flower-deployment"`` (the same app on one
            SuperNode process per client); the Flower runners need the ``fl`` extra and take a minute.

    Attributes:
        statistic_, pvalue_, reject_, null_, null_distribution_, null_mean_, null_var_, n_clients_,
        client_statistics_ (what the server knows of each client), noise_std_ (per client, privacy),
        epsilon_, delta_ (privacy spent, from the accountant), result_ (the ``FedITResult``).
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
        _settings_error(self.null, self.n_permutations, self.random_features, self.privacy, self.copula,
                        self.runner)
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha!r}")

    def fit(self, clients: Any, y: Any = None) -> FederatedIndependenceTest:
        """Run the test on ``clients`` = ``[(X_1, Y_1), ..., (X_K, Y_K)]``."""
        data = check_clients(clients)
        self._check_settings()
        res = _run(data, null=self.null, n_permutations=self.n_permutations, random_features=self.random_features,
                   privacy=self.privacy, copula=self.copula, random_state=self.random_state, runner=self.runner)
        self.result_ = res
        self.client_statistics_ = res.client_statistics
        self.statistic_, self.pvalue_, self.null_ = res.statistic, res.pvalue, res.null
        self.null_distribution_ = res.null_distribution
        self.null_mean_, self.null_var_ = res.null_mean, res.null_var
        self.reject_ = bool(self.pvalue_ < self.alpha)
        self.n_clients_ = res.n_clients
        self.noise_std_ = list(res.noise_std)
        self.epsilon_, self.delta_ = res.epsilon, res.delta
        return self


# ------------------------------------------------------------------- the query as a Flower App's run config
def query_from_run_config(run_config: Mapping[str, Any]) -> FedITQuery:
    """The ``FedITQuery`` the run config describes (settings checked as ``FederatedIndependenceTest`` does)."""
    epsilon = float(run_config["epsilon"])
    privacy = DP(epsilon, float(run_config["delta"])) if epsilon > 0 else None
    settings = FederatedIndependenceTest(
        null=str(run_config["null"]), n_permutations=int(run_config["n-permutations"]),
        random_features=int(run_config["random-features"]) or None, privacy=privacy,
        copula=bool(run_config["copula"]))
    settings._check_settings()
    return FedITQuery(copula=settings.copula, null=settings.null, n_permutations=settings.n_permutations,
                      random_features=settings.random_features, privacy=privacy, seed=int(run_config["seed"]))


def run_config_of(query: FedITQuery, n_clients: int, policy: FailurePolicy | None = None) -> dict[str, Any]:
    """The run config that makes the app run ``query`` over ``n_clients`` clients (inverse of the above)."""
    return {"num-clients": int(n_clients), "null": query.null, "n-permutations": int(query.n_permutations),
            "random-features": int(query.random_features or 0), "copula": bool(query.copula),
            "epsilon": float(query.privacy.epsilon) if query.privacy else 0.0,
            "delta": float(query.privacy.delta) if query.privacy else 1e-5, "seed": int(query.seed),
            **(policy or FailurePolicy()).to_run_config()}


def write_client(path: str | Path, client: tuple[np.ndarray, np.ndarray]) -> Path:
    """Write one client's ``(X, Y)`` to an ``.npz`` (arrays ``X`` and ``Y``) its SuperNode reads (``data-path``)."""
    X, Y = client
    path = Path(path)
    np.savez(path, X=np.asarray(X, dtype=np.float64), Y=np.asarray(Y, dtype=np.float64))
    return path if path.suffix == ".npz" else path.with_name(path.name + ".npz")
