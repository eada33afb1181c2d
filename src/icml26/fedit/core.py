"""Framework-free math of the federated independence test (NumPy/SciPy, float64).

Setting: K clients; client k holds n_k pairs (X, Y) whose marginals may differ across clients. H0: X and Y are
independent within every client. The test (a reconstruction from the abstract and prior work):

1. **Copula alignment** (client): every coordinate replaced by its normalised rank, U = rank / (n_k + 1)
   (average ranks for ties). Under H0 every client's (U, V) has the same independence copula, and all clients
   live on [0, 1]^d, so one fixed bandwidth serves everyone: the median of ||u - u'|| for independent uniform
   u, u' (1 - sqrt(1/2) ~= 0.293 for d = 1), kernel k(u, u') = exp(-||u - u'||^2 / (2 sigma^2)).
2. **Within-client statistics** (client), K~ = H K H, L~ = H L H (Gretton et al. 2008; KCI, Zhang et al. 2011):
   R_k = tr(K~ L~) (= n_k^2 HSIC_b), and its null moments
   mean_k = tr(K~) tr(L~) / n_k,  var_k = 2 ||K~||_F^2 ||L~||_F^2 / n_k^2.
3. **Stacked aggregation** (server): S = sum_k R_k, mu = sum_k mean_k, s^2 = sum_k var_k (clients are
   independent, so null moments add; cross-client pairs never enter). Null (a): Gamma(mu^2 / s^2, s^2 / mu);
   null (b): each client permutes its own V B times and returns its B permuted R_k; S_b = sum_k R_k^(b),
   p = (1 + #{S_b >= S}) / (B + 1).
4. **Acceleration**: D random Fourier features from a server-sent seed, K ~= Phi Phi^T; with centred features
   tr(K~ L~) = ||Phi~^T Psi~||_F^2, tr(K~) = ||Phi~||_F^2, ||K~||_F = ||Phi~^T Phi~||_F: O(n D^2) per client.
5. **Privacy**: Gaussian noise on R_k calibrated (analytic Gaussian mechanism) to a bound on R_k's sensitivity to
   one record; the null becomes the gamma convolved with that noise, so the private test stays calibrated.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=(100, 1)); y = x + 0.3 * rng.normal(size=(100, 1))
    >>> stats = client_statistics(copula_transform(x), copula_transform(y), uniform_median_bandwidth(1),
    ...                           uniform_median_bandwidth(1))
    >>> aggregate([stats]).pvalue < 1e-6
    True
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.special
import scipy.stats


def copula_transform(X: np.ndarray, method: str = "rank") -> np.ndarray:
    """Per-column normalised ranks rank / (n + 1) (average ranks for ties), or normal scores Phi^-1 of them."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim == 1:
        X = X[:, None]
    n = X.shape[0]
    # $$U_{ij} = \mathrm{rank}(X_{ij}) / (n + 1)$$
    U = scipy.stats.rankdata(X, axis=0, method="average") / (n + 1)
    if method == "rank":
        return U
    if method == "normal_scores":
        return scipy.stats.norm.ppf(U)
    raise ValueError(f"method must be 'rank' or 'normal_scores', got {method!r}")


@functools.lru_cache(maxsize=32)
def uniform_median_bandwidth(d: int, samples: int = 200_000) -> float:
    """Median of ||u - u'|| for independent uniforms on [0, 1]^d (exact for d = 1: 1 - sqrt(1/2))."""
    if d < 1:
        raise ValueError(f"d must be >= 1, got {d}")
    if d == 1:
        return 1.0 - math.sqrt(0.5)
    rng = np.random.default_rng(12345)  # a fixed, data-independent constant
    return float(np.median(np.linalg.norm(rng.random((samples, d)) - rng.random((samples, d)), axis=1)))


def median_heuristic(X: np.ndarray) -> float:
    """Median pairwise distance of the rows of X (first 1000 rows), the usual data-driven bandwidth."""
    X = np.asarray(X, dtype=np.float64)[:1000]
    from scipy.spatial.distance import pdist

    d = pdist(X)
    d = d[d > 0]
    return float(np.median(d)) if d.size else 1.0


def gaussian_gram(X: np.ndarray, bandwidth: float) -> np.ndarray:
    """k(x, x') = exp(-||x - x'||^2 / (2 bandwidth^2))."""
    sq = np.sum(X**2, axis=1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2 * X @ X.T, 0.0)
    return np.exp(-d2 / (2.0 * bandwidth**2))


def centre(K: np.ndarray) -> np.ndarray:
    """H K H with H = I - 11^T / n."""
    return K - K.mean(axis=0, keepdims=True) - K.mean(axis=1, keepdims=True) + K.mean()


def random_fourier_features(X: np.ndarray, bandwidth: float, n_features: int, seed: int) -> np.ndarray:
    """sqrt(2/D) cos(X W + b), W ~ N(0, 1/bandwidth^2), b ~ U[0, 2 pi): E[phi(x) . phi(x')] = k(x, x')."""
    rng = np.random.default_rng(seed)
    W = rng.normal(scale=1.0 / bandwidth, size=(X.shape[1], n_features))
    b = rng.uniform(0.0, 2 * np.pi, size=n_features)
    return np.sqrt(2.0 / n_features) * np.cos(X @ W + b)


@dataclass(frozen=True)
class ClientStatistics:
    """What one client releases: its sample size, R_k, the null moments, optional permuted statistics."""

    n: int
    statistic: float
    """R_k = tr(K~ L~)"""
    null_mean: float
    """tr(K~) tr(L~) / n"""
    null_var: float
    """2 ||K~||_F^2 ||L~||_F^2 / n^2"""
    permuted: np.ndarray | None = None
    """R_k under B within-client permutations of V"""
    noise_var: float = 0.0
    """variance of the privacy noise added to ``statistic`` (0 without privacy)"""


def client_statistics(U: np.ndarray, V: np.ndarray, bandwidth_x: float, bandwidth_y: float, *,
                      n_permutations: int = 0, rng: np.random.Generator | None = None,
                      random_features: int | None = None, feature_seed: int = 0) -> ClientStatistics:
    """A client's summary of its (already transformed) sample: exact kernels, or random features."""
    n = U.shape[0]
    if random_features is None:
        Kc = centre(gaussian_gram(U, bandwidth_x))
        Lc = centre(gaussian_gram(V, bandwidth_y))
        # $$R_k = \mathrm{tr}(\tilde K \tilde L)$$
        stat = float(np.sum(Kc * Lc))
        tr_k, tr_l = float(np.trace(Kc)), float(np.trace(Lc))
        fro_k, fro_l = float(np.sum(Kc**2)), float(np.sum(Lc**2))

        def permuted_stat(p: np.ndarray) -> float:
            return float(np.sum(Kc * Lc[np.ix_(p, p)]))
    else:
        Phi = random_fourier_features(U, bandwidth_x, random_features, feature_seed)
        Psi = random_fourier_features(V, bandwidth_y, random_features, feature_seed + 1)
        Phi -= Phi.mean(axis=0)
        Psi -= Psi.mean(axis=0)
        # $$\mathrm{tr}(\tilde K \tilde L) = \|\tilde\Phi^\top \tilde\Psi\|_F^2$$
        stat = float(np.sum((Phi.T @ Psi) ** 2))
        tr_k, tr_l = float(np.sum(Phi**2)), float(np.sum(Psi**2))
        fro_k, fro_l = float(np.sum((Phi.T @ Phi) ** 2)), float(np.sum((Psi.T @ Psi) ** 2))

        def permuted_stat(p: np.ndarray) -> float:
            return float(np.sum((Phi.T @ Psi[p]) ** 2))
    # $$m_k = \mathrm{tr}(\tilde K)\mathrm{tr}(\tilde L) / n, \quad v_k = 2\|\tilde K\|_F^2 \|\tilde L\|_F^2 / n^2$$
    mean, var = tr_k * tr_l / n, 2.0 * fro_k * fro_l / n**2
    permuted = None
    if n_permutations:
        rng = np.random.default_rng() if rng is None else rng
        # permute V (only V) within this client
        permuted = np.array([permuted_stat(rng.permutation(n)) for _ in range(n_permutations)])
    return ClientStatistics(n, stat, mean, var, permuted)


@dataclass(frozen=True)
class TestResult:
    """The aggregated test."""

    statistic: float
    pvalue: float
    null_mean: float
    null_var: float
    null: str


def aggregate(stats: Sequence[ClientStatistics], null: str = "gamma") -> TestResult:
    """Stack the clients' statistics: S = sum R_k; p from the gamma null or the pooled permutations."""
    if not stats:
        raise ValueError("need at least one client's statistics")
    S = sum(s.statistic for s in stats)
    mu = sum(s.null_mean for s in stats)
    var = sum(s.null_var for s in stats)
    noise_var = sum(s.noise_var for s in stats)
    if null == "gamma":
        if mu <= 0 or var <= 0:
            return TestResult(S, 1.0, mu, var + noise_var, null)
        # $$S \sim \Gamma\left(\mu^2/s^2,\ s^2/\mu\right) \text{ under } H_0$$
        shape, scale = mu**2 / var, var / mu
        if noise_var == 0:
            p = float(scipy.stats.gamma.sf(S, shape, scale=scale))
        else:
            # the privacy noise is part of the null (else the private test is anti-conservative):
            # $$p = P(G + N \ge S) = \mathbb{E}_G\, \bar\Phi\big((S - G)/\sigma\big)$$, G ~ gamma, N ~ N(0, sigma^2),
            # averaged over 2000 equally spaced gamma quantiles
            q = scipy.stats.gamma.ppf((np.arange(2000) + 0.5) / 2000, shape, scale=scale)
            p = float(np.mean(scipy.stats.norm.sf((S - q) / math.sqrt(noise_var))))
        var = var + noise_var
    elif null == "permutation":
        if any(s.permuted is None for s in stats) or len({len(s.permuted) for s in stats}) != 1:
            raise ValueError("the permutation null needs the same number of permuted statistics from every client")
        B = len(stats[0].permuted)
        S_b = np.sum([s.permuted for s in stats], axis=0)
        # $$p = \frac{1 + \#\{b : S_b \ge S\}}{B + 1}$$
        p = (1.0 + float(np.sum(S_b >= S))) / (B + 1.0)
    else:
        raise ValueError(f"null must be 'gamma' or 'permutation', got {null!r}")
    return TestResult(S, p, mu, var, null)


# --------------------------------------------------------------------------------------------------- privacy
def gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """The analytic Gaussian mechanism's noise scale (Balle & Wang 2018): the smallest sigma with
    Phi(D/(2s) - e s/D) - exp(e) Phi(-D/(2s) - e s/D) <= delta, D the L2 sensitivity."""
    if not (epsilon > 0 and 0 < delta < 1 and sensitivity > 0):
        raise ValueError(f"need epsilon > 0, 0 < delta < 1, sensitivity > 0; got {epsilon}, {delta}, {sensitivity}")
    Phi = scipy.special.ndtr

    def excess(sigma: float) -> float:
        a = sensitivity / (2 * sigma)
        b = epsilon * sigma / sensitivity
        return Phi(a - b) - math.exp(epsilon) * Phi(-a - b) - delta

    lo, hi = 1e-6 * sensitivity, sensitivity
    while excess(hi) > 0:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if excess(mid) > 0 else (lo, mid)
    return hi


def rank_statistic_sensitivity(n: int, bandwidth_x: float, bandwidth_y: float, d_x: int, d_y: int) -> float:
    """An upper bound on how much R_k = tr(K~ L~) on copula-transformed data moves when one record changes.

    With kernel values in [0, 1], HSIC_b = R / n^2 changes by at most 12 / n when one pair is replaced and
    nothing else moves (4 / n, 6 / n and 2 / n from the three terms of its V-statistic expansion). Replacing a
    record also moves every other record's rank by at most 1, i.e. each copula coordinate by at most
    1 / (n + 1); a Gaussian kernel with bandwidth s is (1 / (s sqrt(e)))-Lipschitz in the distance, so every
    entry of K moves by at most l_x / (n + 1), l_x = 2 sqrt(d_x) / (s_x sqrt(e)), which moves HSIC_b by at most
    4 l_x / (n + 1) (and likewise for L). Hence Delta R <= n^2 (12 / n + 4 (l_x + l_y) / (n + 1)).
    """
    lx = 2 * math.sqrt(d_x) / (bandwidth_x * math.sqrt(math.e))
    ly = 2 * math.sqrt(d_y) / (bandwidth_y * math.sqrt(math.e))
    # $$\Delta R \le n^2 \left(\frac{12}{n} + \frac{4(\ell_x + \ell_y)}{n + 1}\right)$$
    return n * n * (12.0 / n + 4.0 * (lx + ly) / (n + 1))
