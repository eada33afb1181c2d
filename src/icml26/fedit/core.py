"""Framework-free math of the federated independence test (NumPy/SciPy, float64).

Setting: K clients; client k holds n_k pairs (X, Y) whose marginals may differ across clients. H0: X and Y are
independent within every client. The test (a reconstruction from the abstract and prior work):

1. **Copula alignment** (client): every coordinate replaced by its normalised rank, U = rank / (n_k + 1)
   (average ranks for ties; in private mode ties are broken at random, so the ranks are a permutation of
   1..n_k). Under H0 every client's (U, V) has the same independence copula, and all clients live on [0, 1]^d,
   so one fixed bandwidth serves everyone: the median of ||u - u'|| for independent uniform u, u'
   (1 - sqrt(1/2) ~= 0.293 for d = 1), kernel k(u, u') = exp(-||u - u'||^2 / (2 sigma^2)).
2. **Within-client statistic** (client), K~ = H K H, L~ = H L H (Gretton et al. 2008; KCI, Zhang et al. 2011):
   R_k = tr(K~ L~) (= n_k^2 HSIC_b), and its null mean and variance, **exact** under the within-client
   permutation null (``permutation_moments``; the asymptotic moments tr(K~)tr(L~)/n, 2||K~||^2||L~||^2/n^2 of
   Gretton et al. are biased by O(1/n_k) per client, an error that adds up over many small clients).
3. **Stacked aggregation** (server): S = sum_k R_k, mu = sum_k E R_k, s^2 = sum_k Var R_k (clients are
   independent, so null moments add; cross-client pairs never enter). Null (a): Gamma(mu^2 / s^2, s^2 / mu);
   null (b): each client permutes its own V B times and returns its B permuted R_k; S_b = sum_k R_k^(b),
   p = (1 + #{S_b >= S}) / (B + 1).
4. **Acceleration**: D random Fourier features from a server-sent seed, K ~= Phi Phi^T; with centred features
   tr(K~ L~) = ||Phi~^T Psi~||_F^2, tr(K~) = ||Phi~||_F^2, ||K~||_F = ||Phi~^T Phi~||_F: O(n D^2) per client.
5. **Privacy** (1-D X and Y): each client releases sqrt(R_k) + N(0, sigma_k^2), the analytic Gaussian
   mechanism calibrated to the proven sensitivity of sqrt(R_k) (``root_statistic_sensitivity``, constant in
   n); the server sums the noisy roots and compares them with a Monte Carlo null: per client sqrt of a draw
   from its exact-moment gamma null (data-free in private mode) plus the known noise.

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

MOMENTS = ("permutation", "asymptotic")
NULLS = ("gamma", "permutation", "private")


# ------------------------------------------------------------------------------------------------ alignment
def _ranks(col: np.ndarray, rng: np.random.Generator | None) -> np.ndarray:
    """Ranks 1..n of one column: average ranks for ties (``rng`` None) or ties broken at random by a uniform key
    drawn per row (then the ranks are always a permutation of 1..n)."""
    n = col.shape[0]
    order = np.lexsort((rng.random(n), col)) if rng is not None else np.argsort(col, kind="stable")
    ranks = np.empty(n)
    ranks[order] = np.arange(1, n + 1)
    if rng is None:
        s = col[order]
        if np.any(s[1:] == s[:-1]):
            return scipy.stats.rankdata(col, method="average")
    return ranks


def copula_transform(X: np.ndarray, method: str = "rank", rng: np.random.Generator | None = None) -> np.ndarray:
    """Per-column normalised ranks rank / (n + 1), or normal scores Phi^-1 of them.

    Args:
        X: (n,) or (n, d) data.
        method: ``"rank"`` or ``"normal_scores"``.
        rng: None for average ranks of ties; a generator to break ties at random (private mode), so that every
            column's ranks are a permutation of 1..n.
    """
    if method not in ("rank", "normal_scores"):
        raise ValueError(f"method must be 'rank' or 'normal_scores', got {method!r}")
    X = np.asarray(X, dtype=np.float64)
    if X.ndim == 1:
        X = X[:, None]
    n = X.shape[0]
    # $$U_{ij} = \mathrm{rank}(X_{ij}) / (n + 1)$$
    U = np.empty_like(X)
    for j in range(X.shape[1]):
        U[:, j] = _ranks(X[:, j], rng) / (n + 1)
    return U if method == "rank" else scipy.stats.norm.ppf(U)


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


# ------------------------------------------------------------------------------------------------- kernels
def gaussian_gram(X: np.ndarray, bandwidth: float) -> np.ndarray:
    """k(x, x') = exp(-||x - x'||^2 / (2 bandwidth^2))."""
    if X.shape[1] == 1:
        d2 = (X - X.T) ** 2
    else:
        sq = np.sum(X**2, axis=1)
        d2 = np.maximum(sq[:, None] + sq[None, :] - 2 * X @ X.T, 0.0)
    return np.exp(-d2 / (2.0 * bandwidth**2))


def centre(K: np.ndarray) -> np.ndarray:
    """H K H with H = I - 11^T / n."""
    r = K.mean(axis=0)
    return K - r[None, :] - r[:, None] + r.mean()


def random_fourier_features(X: np.ndarray, bandwidth: float, n_features: int, seed: int) -> np.ndarray:
    """sqrt(2/D) cos(X W + b), W ~ N(0, 1/bandwidth^2), b ~ U[0, 2 pi): E[phi(x) . phi(x')] = k(x, x')."""
    rng = np.random.default_rng(seed)
    W = rng.normal(scale=1.0 / bandwidth, size=(X.shape[1], n_features))
    b = rng.uniform(0.0, 2 * np.pi, size=n_features)
    return np.sqrt(2.0 / n_features) * np.cos(X @ W + b)


# ------------------------------------------------------------------------------------------ null moments
def permutation_moments(a: Sequence[float], b: Sequence[float], n: int) -> tuple[float, float]:
    """Exact mean and variance of R_pi = tr(A P_pi B P_pi^T) over the n! permutations pi of one sample.

    A = K~ and B = L~ are symmetric with zero row sums (centred Gram matrices); ``a = (a1, a2, a3)`` with
    a1 = tr A, a2 = sum_i A_ii^2, a3 = ||A||_F^2 (``centred_summaries``), ``b`` likewise. Under H0 and
    exchangeable rows, R_k's permutation distribution is its null distribution given the data, so these are
    its exact conditional null moments (Mantel / quadratic-assignment moments, e.g. Hubert 1987):

        E R_pi = a1 b1 / (n - 1)
        Var R_pi = [ (n^2 - 2n - 1) a1^2 b1^2 - n (n-1)^2 (a1^2 b2 + a2 b1^2) + 2 (n-1) (a1^2 b3 + a3 b1^2)
                     + n^2 (n^2 - 1) a2 b2 - 2 n (n-1)^2 (a2 b3 + a3 b2) + 2 (n-1)^2 (n-2) a3 b3 ]
                   / [ n (n-1)^2 (n-2) (n-3) ]

    Derivation: E R_pi^2 = sum over the 15 equality patterns P of an index tuple (i, j, k, l) of
    S_A(P) S_B(P) / (n)_{|P|}, where S_A(P) sums A_ij A_kl over the tuples with exactly pattern P and (n)_m is
    the falling factorial (pi maps a tuple of pattern P uniformly onto the tuples of pattern P). S_A(P) follows by
    Moebius inversion on the partition lattice from the sums with blocks tied; with zero row sums every such sum
    with a singleton block vanishes, leaving a2 ({ijkl}), a1^2 ({ij}{kl}) and a3 ({ik}{jl}, {il}{jk}). The
    asymptotic moments tr(A)tr(B)/n and 2 a3 b3 / n^2 are the leading terms. Needs n >= 4.

    Returns:
        (mean, variance).
    """
    if n < 4:
        raise ValueError(f"the exact permutation variance needs n >= 4 rows, got {n}")
    a1, a2, a3 = (float(v) for v in a)
    b1, b2, b3 = (float(v) for v in b)
    # $$\mathbb{E} R_\pi = a_1 b_1 / (n - 1)$$
    mean = a1 * b1 / (n - 1)
    num = ((n * n - 2 * n - 1) * a1**2 * b1**2 - n * (n - 1) ** 2 * (a1**2 * b2 + a2 * b1**2)
           + 2 * (n - 1) * (a1**2 * b3 + a3 * b1**2) + n * n * (n * n - 1) * a2 * b2
           - 2 * n * (n - 1) ** 2 * (a2 * b3 + a3 * b2) + 2 * (n - 1) ** 2 * (n - 2) * a3 * b3)
    var = num / (n * (n - 1) ** 2 * (n - 2) * (n - 3))
    return mean, max(var, 0.0)


def asymptotic_moments(a: Sequence[float], b: Sequence[float], n: int) -> tuple[float, float]:
    """Gretton et al. (2008) / KCI null moments of R = tr(K~ L~): tr(K~)tr(L~)/n and 2||K~||^2||L~||^2/n^2.

    Kept for comparison (the landed test used them): biased for small n (the mean divides by n, not n - 1)."""
    return float(a[0]) * float(b[0]) / n, 2.0 * float(a[2]) * float(b[2]) / n**2


def gram_statistics(K: np.ndarray, L: np.ndarray) -> tuple[float, tuple[float, float, float],
                                                             tuple[float, float, float]]:
    """R = tr(K~ L~) and the summaries (a1, a2, a3), (b1, b2, b3) of K~ = HKH, L~ = HLH, from the uncentred
    symmetric Gram matrices (three passes each, no centred copy):
    tr(K~ L~) = sum K o L - (2/n) r_K . r_L + t_K t_L / n^2 with r = K 1, t = 1^T K 1;
    ||K~||_F^2 = ||K||_F^2 - (2/n) ||r_K||^2 + t_K^2 / n^2; K~_ii = K_ii - 2 r_i / n + t / n^2."""
    n = K.shape[0]
    out = []
    for A in (K, L):
        r = A.sum(axis=1)
        t = float(r.sum())
        diag = np.diagonal(A) - 2.0 * r / n + t / n**2
        a3 = float(np.einsum("ij,ij->", A, A)) - 2.0 / n * float(r @ r) + t * t / n**2
        out.append((r, t, (float(diag.sum()), float(diag @ diag), a3)))
    (rK, tK, a), (rL, tL, b) = out
    # $$\mathrm{tr}(\tilde K \tilde L) = \sum_{ij} K_{ij} L_{ij} - \tfrac{2}{n} (K1)^\top (L1) + \tfrac{(1^\top K 1)(1^\top L 1)}{n^2}$$
    stat = float(np.einsum("ij,ij->", K, L)) - 2.0 / n * float(rK @ rL) + tK * tL / n**2
    return stat, a, b


def centred_summaries(Kc: np.ndarray) -> tuple[float, float, float]:
    """(tr K~, sum_i K~_ii^2, ||K~||_F^2) of a centred Gram matrix."""
    diag = np.diagonal(Kc)
    return float(diag.sum()), float(diag @ diag), float(np.einsum("ij,ij->", Kc, Kc))


def feature_summaries(Phi: np.ndarray) -> tuple[float, float, float]:
    """The same three summaries for K~ = Phi~ Phi~^T given centred features Phi~ (O(n D^2))."""
    sq = np.einsum("ij,ij->i", Phi, Phi)
    G = Phi.T @ Phi
    return float(sq.sum()), float(sq @ sq), float(np.einsum("ij,ij->", G, G))


def null_moments(a: Sequence[float], b: Sequence[float], n: int, moments: str = "permutation"
                 ) -> tuple[float, float]:
    """``permutation_moments`` (default) or ``asymptotic_moments``."""
    if moments == "permutation":
        return permutation_moments(a, b, n)
    if moments == "asymptotic":
        return asymptotic_moments(a, b, n)
    raise ValueError(f"moments must be one of {MOMENTS}, got {moments!r}")


# --------------------------------------------------------------------------------------------- clients
@dataclass(frozen=True)
class ClientStatistics:
    """What the server knows of one client: its sample size, released statistic, null moments, optional
    permuted statistics and privacy noise."""

    n: int
    statistic: float
    """R_k = tr(K~ L~); in private mode the released sqrt(R_k) + noise"""
    null_mean: float
    """exact permutation mean of R_k (or the asymptotic one)"""
    null_var: float
    """exact permutation variance of R_k (or the asymptotic one)"""
    permuted: np.ndarray | None = None
    """R_k under B within-client permutations of V"""
    noise_var: float = 0.0
    """variance of the privacy noise added to ``statistic`` (0 without privacy)"""


def _grid_index(U: np.ndarray) -> np.ndarray | None:
    """Row indices into the rank grid when the 1-D sample U is a permutation of it (distinct integer ranks
    / (n + 1)), else None."""
    n = U.shape[0]
    if U.shape[1] != 1 or n == 0:
        return None
    r = U[:, 0] * (n + 1)
    idx = np.rint(r)
    if np.max(np.abs(r - idx)) > 1e-9 or idx.min() < 1 or idx.max() > n:
        return None
    idx = idx.astype(np.intp) - 1
    return idx if np.bincount(idx, minlength=n).max() == 1 else None


def centred_features(U: np.ndarray, bandwidth: float, n_features: int, seed: int
                     ) -> tuple[np.ndarray, tuple[float, float, float]]:
    """Centred random Fourier features Phi~ of U and their summaries (a1, a2, a3).

    A 1-D sample on the rank grid (ranks without ties: every private client, and continuous data) takes its
    rows from the grid's features, computed once per (n, bandwidth, D, seed) and shared by every client of that
    size; the summaries are then the grid's (they are invariant under row permutations)."""
    idx = _grid_index(U)
    if idx is not None:
        Zc, summaries = _rff_grid(U.shape[0], float(bandwidth), int(n_features), int(seed))
        # a permutation of the grid: same feature mean, so centring commutes with the gather
        return Zc[idx], summaries
    Phi = random_fourier_features(U, bandwidth, n_features, seed)
    Phi -= Phi.mean(axis=0)
    return Phi, feature_summaries(Phi)


def client_statistics(U: np.ndarray, V: np.ndarray, bandwidth_x: float, bandwidth_y: float, *,
                      n_permutations: int = 0, rng: np.random.Generator | None = None,
                      random_features: int | None = None, feature_seed: int = 0,
                      moments: str = "permutation") -> ClientStatistics:
    """A client's summary of its (already transformed) sample: exact kernels, or random features.

    Args:
        U, V: (n, d_x), (n, d_y) transformed data.
        bandwidth_x, bandwidth_y: Gaussian kernel bandwidths.
        n_permutations: B permuted statistics to return (0: none).
        rng: generator of the permutations.
        random_features: D random Fourier features (None: exact kernels); ``feature_seed`` their seed.
        moments: ``"permutation"`` (exact, default) or ``"asymptotic"`` null moments.

    Returns:
        ``ClientStatistics`` with R_k and its null moments.
    """
    n = U.shape[0]
    if random_features is None:
        K, L = gaussian_gram(U, bandwidth_x), gaussian_gram(V, bandwidth_y)
        # $$R_k = \mathrm{tr}(\tilde K \tilde L)$$
        stat, a, b = gram_statistics(K, L)

        def permuted_stats(P: np.ndarray) -> np.ndarray:
            # tr(K~ P L~ P^T) = sum K o (P L~ P^T): P L~ P^T is already centred
            return np.einsum("ij,bij->b", K, Lc[P[:, :, None], P[:, None, :]])

        Lc = centre(L) if n_permutations else L
    else:
        (Phi, a), (Psi, b) = (centred_features(U, bandwidth_x, random_features, feature_seed),
                              centred_features(V, bandwidth_y, random_features, feature_seed + 1))
        # $$\mathrm{tr}(\tilde K \tilde L) = \|\tilde\Phi^\top \tilde\Psi\|_F^2$$
        stat = float(np.sum((Phi.T @ Psi) ** 2))

        def permuted_stats(P: np.ndarray) -> np.ndarray:
            return np.sum((Phi.T @ Psi[P]) ** 2, axis=(1, 2))
    # $$\mathbb{E}_\pi R = \frac{a_1 b_1}{n - 1}, \quad \mathrm{Var}_\pi R \text{ (permutation\_moments)}$$
    mean, var = null_moments(a, b, n, moments)
    permuted = None
    if n_permutations:
        rng = np.random.default_rng() if rng is None else rng
        # permute V (only V) within this client
        P = np.stack([rng.permutation(n) for _ in range(n_permutations)])
        width = n * (n if random_features is None else random_features)
        chunk = max(1, 4_000_000 // width)             # permutations per batch: a few MB of gathered rows
        permuted = np.concatenate([permuted_stats(P[i:i + chunk]) for i in range(0, n_permutations, chunk)])
    return ClientStatistics(n, stat, mean, var, permuted)


# ------------------------------------------------------------------------------------------ aggregation
def gamma_sf(x: float, mean: float, var: float) -> float:
    """P(G >= x) for the gamma with this mean and variance (shape mean^2/var, scale var/mean); 1 when either
    moment is not positive (a degenerate null)."""
    if mean <= 0 or var <= 0:
        return 1.0
    # $$1 - F_\Gamma(x;\ \mu^2/s^2,\ s^2/\mu)$$ (the regularised upper incomplete gamma function)
    return float(scipy.special.gammaincc(mean * mean / var, max(x, 0.0) * mean / var))


@dataclass(frozen=True)
class TestResult:
    """The aggregated test."""

    statistic: float
    pvalue: float
    null_mean: float
    """mean of the null of ``statistic`` (gamma: sum of the clients' moments)"""
    null_var: float
    null: str
    null_samples: np.ndarray | None = None
    """the permuted stacked statistics (permutation null) or the Monte Carlo null draws (private null)"""

    @property
    def gamma_parameters(self) -> tuple[float, float] | None:
        """(shape, scale) of the gamma null (``null == "gamma"``), else None."""
        if self.null != "gamma" or self.null_mean <= 0 or self.null_var <= 0:
            return None
        return self.null_mean**2 / self.null_var, self.null_var / self.null_mean


def private_null_samples(stats: Sequence[ClientStatistics], draws: int, rng: np.random.Generator) -> np.ndarray:
    """Draws of sum_k (sqrt(G_k) + N_k), G_k ~ Gamma with client k's null moments, N_k ~ N(0, noise_var_k)."""
    out = np.zeros(draws)
    for s in stats:
        if s.null_mean > 0 and s.null_var > 0:
            shape, scale = s.null_mean**2 / s.null_var, s.null_var / s.null_mean
            # $$\sqrt{G_k},\ G_k \sim \Gamma(m_k^2/v_k,\ v_k/m_k)$$
            out += np.sqrt(rng.gamma(shape, scale, size=draws))
        out += rng.normal(scale=math.sqrt(s.noise_var), size=draws)
    return out


def aggregate(stats: Sequence[ClientStatistics], null: str = "gamma", *, draws: int = 10_000,
              rng: np.random.Generator | None = None) -> TestResult:
    """Stack the clients' statistics: S = sum R_k (sum of noisy roots for ``null="private"``).

    Args:
        stats: one ``ClientStatistics`` per client.
        null: ``"gamma"`` (summed moments), ``"permutation"`` (summed permuted statistics) or ``"private"``
            (Monte Carlo null of the sum of released roots: each client's gamma null, square-rooted, plus its
            noise).
        draws, rng: size and generator of the Monte Carlo null (``"private"``).
    """
    if not stats:
        raise ValueError("need at least one client's statistics")
    S = float(sum(s.statistic for s in stats))
    mu = float(sum(s.null_mean for s in stats))
    var = float(sum(s.null_var for s in stats))
    noise_var = float(sum(s.noise_var for s in stats))
    if null == "gamma":
        if noise_var > 0:
            raise ValueError("noisy (private) statistics need null='private'")
        # $$S \sim \Gamma\left(\mu^2/s^2,\ s^2/\mu\right) \text{ under } H_0$$
        return TestResult(S, gamma_sf(S, mu, var), mu, var, null)
    if null == "permutation":
        if any(s.permuted is None for s in stats) or len({len(s.permuted) for s in stats}) != 1:
            raise ValueError("the permutation null needs the same number of permuted statistics from every client")
        B = len(stats[0].permuted)
        S_b = np.sum([s.permuted for s in stats], axis=0)
        # $$p = \frac{1 + \#\{b : S_b \ge S\}}{B + 1}$$
        p = (1.0 + float(np.sum(S_b >= S))) / (B + 1.0)
        return TestResult(S, p, mu, var, null, S_b)
    if null == "private":
        if not (isinstance(draws, int) and draws >= 1):
            raise ValueError(f"draws must be a positive int, got {draws!r}")
        samples = private_null_samples(stats, draws, np.random.default_rng() if rng is None else rng)
        # $$p = \frac{1 + \#\{b : \sum_k (\sqrt{G_{kb}} + N_{kb}) \ge S\}}{B + 1}$$
        p = (1.0 + float(np.sum(samples >= S))) / (draws + 1.0)
        return TestResult(S, p, float(samples.mean()), float(samples.var()), null, samples)
    raise ValueError(f"null must be one of {NULLS}, got {null!r}")


# --------------------------------------------------------------------------------------------------- privacy
def gaussian_delta(mu: float, epsilon: float) -> float:
    """delta(epsilon) of a Gaussian mechanism with sensitivity / sigma = mu (mu-GDP; exact, Balle & Wang 2018):
    delta = Phi(mu/2 - epsilon/mu) - exp(epsilon) Phi(-mu/2 - epsilon/mu)."""
    if not (mu > 0 and epsilon >= 0):
        raise ValueError(f"need mu > 0 and epsilon >= 0, got {mu}, {epsilon}")
    Phi = scipy.special.ndtr
    # $$\delta(\varepsilon) = \Phi(\mu/2 - \varepsilon/\mu) - e^{\varepsilon}\Phi(-\mu/2 - \varepsilon/\mu)$$
    return float(max(Phi(mu / 2 - epsilon / mu) - math.exp(epsilon) * Phi(-mu / 2 - epsilon / mu), 0.0))


def gaussian_epsilon(mu: float, delta: float) -> float:
    """The smallest epsilon with ``gaussian_delta(mu, epsilon) <= delta`` (bisection to 1e-10)."""
    if not (mu > 0 and 0 < delta < 1):
        raise ValueError(f"need mu > 0 and 0 < delta < 1, got {mu}, {delta}")
    if gaussian_delta(mu, 0.0) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while gaussian_delta(mu, hi) > delta:
        lo, hi = hi, 2 * hi
    while hi - lo > 1e-10 * max(1.0, hi):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if gaussian_delta(mu, mid) > delta else (lo, mid)
    return hi


@functools.lru_cache(maxsize=256)
def gaussian_mu(epsilon: float, delta: float) -> float:
    """The largest mu (= sensitivity / sigma) with ``gaussian_delta(mu, epsilon) <= delta`` (bisection on the
    increasing function mu -> delta(mu, epsilon), relative width 1e-12)."""
    lo, hi = 0.0, 1.0
    while gaussian_delta(hi, epsilon) <= delta:
        lo, hi = hi, 2.0 * hi
    while hi - lo > 1e-12 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if gaussian_delta(mid, epsilon) <= delta else (lo, mid)
    return lo


def gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """The analytic Gaussian mechanism's noise scale (Balle & Wang 2018): the smallest sigma with
    Phi(D/(2s) - e s/D) - exp(e) Phi(-D/(2s) - e s/D) <= delta, D the L2 sensitivity (sigma = D / mu)."""
    if not (epsilon > 0 and 0 < delta < 1 and sensitivity > 0):
        raise ValueError(f"need epsilon > 0, 0 < delta < 1, sensitivity > 0; got {epsilon}, {delta}, {sensitivity}")
    return sensitivity / gaussian_mu(float(epsilon), float(delta))


class GaussianAccountant:
    """Exact (epsilon, delta) of composed Gaussian mechanisms through Gaussian differential privacy.

    A release with L2 sensitivity D and noise sigma is mu-GDP with mu = D / sigma; k releases compose to
    sqrt(sum mu_i^2)-GDP exactly (Dong, Roth & Su 2022), and mu-GDP is (epsilon, ``gaussian_delta(mu, epsilon)``)-DP
    for every epsilon. One test costs each client one release; a user who tests the same data again composes.

    Example:
        >>> acc = GaussianAccountant()
        >>> acc.compose(sensitivity=1.0, sigma=gaussian_sigma(1.0, 1e-5, 1.0))
        >>> round(acc.epsilon(1e-5), 6)
        1.0
    """

    def __init__(self) -> None:
        self.mu_squared = 0.0
        self.releases = 0

    def compose(self, sensitivity: float, sigma: float, count: int = 1) -> None:
        """Add ``count`` releases with this sensitivity and noise standard deviation."""
        if not (sensitivity > 0 and sigma > 0 and count >= 1):
            raise ValueError(f"need sensitivity > 0, sigma > 0, count >= 1; got {sensitivity}, {sigma}, {count}")
        self.mu_squared += count * (sensitivity / sigma) ** 2
        self.releases += count

    @property
    def mu(self) -> float:
        return math.sqrt(self.mu_squared)

    def epsilon(self, delta: float) -> float:
        """Spent epsilon at ``delta`` (0 before any release)."""
        return gaussian_epsilon(self.mu, delta) if self.releases else 0.0

    def delta(self, epsilon: float) -> float:
        """Spent delta at ``epsilon``."""
        return gaussian_delta(self.mu, epsilon) if self.releases else 0.0


# --------------------------------------------------------------------- sensitivity of the released root
def grid(n: int) -> np.ndarray:
    """The rank grid {1, ..., n} / (n + 1) as an (n, 1) column: every private client's U and V are permutations
    of it."""
    return (np.arange(1, n + 1, dtype=np.float64) / (n + 1))[:, None]


@functools.lru_cache(maxsize=256)
def _gaussian_grid_summaries(n: int, bandwidth: float) -> tuple[float, float, float, float, float]:
    """For the Gaussian kernel on the grid, in O(n) (its Gram matrix is Toeplitz): (a1, a2, a3) of K~, the
    largest ||phi(g) - phi_bar|| over grid points (c) and the distance ||phi(g) - phi(g')|| of adjacent
    points (e)."""
    d = np.arange(n, dtype=np.float64) / (n + 1)
    k = np.exp(-(d**2) / (2.0 * bandwidth**2))      # k(g_i, g_j) = k[|i - j|]
    cum = np.cumsum(k)
    i = np.arange(n)
    rows = cum[i] + cum[n - 1 - i] - k[0]             # sum_j k(g_i, g_j)
    m = rows / n                                      # <phi(g_i), phi_bar>
    M = float(m.mean())                               # ||phi_bar||^2
    diag = 1.0 - 2.0 * m + M                          # K~_ii = ||phi(g_i) - phi_bar||^2
    counts = np.where(i == 0, n, 2 * (n - i))         # ordered pairs at distance |i - j| = d
    fro_K = float(counts @ k**2)
    # ||K~||_F^2 = ||K||_F^2 - (2/n) ||K 1||^2 + (1^T K 1)^2 / n^2
    a3 = fro_K - 2.0 / n * float(rows @ rows) + (n * M) ** 2
    c = math.sqrt(max(float(diag.max()), 0.0))
    e = math.sqrt(2.0 - 2.0 * math.exp(-1.0 / (2.0 * bandwidth**2 * (n + 1) ** 2)))
    return float(diag.sum()), float(diag @ diag), a3, c, e


@functools.lru_cache(maxsize=16)
def _rff_grid(n: int, bandwidth: float, n_features: int, seed: int
              ) -> tuple[np.ndarray, tuple[float, float, float]]:
    """Centred random features of the grid (read-only) and their summaries."""
    Z = random_fourier_features(grid(n), bandwidth, n_features, seed)
    Zc = Z - Z.mean(axis=0)
    Zc.flags.writeable = False
    return Zc, feature_summaries(Zc)


@functools.lru_cache(maxsize=256)
def _rff_grid_summaries(n: int, bandwidth: float, n_features: int, seed: int
                        ) -> tuple[float, float, float, float, float]:
    """The same for D random Fourier features with this seed: (a1, a2, a3), c = max ||z(g) - z_bar||,
    e = max ||z(g_i) - z(g_{i+1})||."""
    Zc, summaries = _rff_grid(n, bandwidth, n_features, seed)
    c = float(np.sqrt(np.max(np.einsum("ij,ij->i", Zc, Zc))))
    e = float(np.sqrt(np.max(np.sum(np.diff(Zc, axis=0) ** 2, axis=1)))) if n > 1 else 0.0
    return (*summaries, c, e)


def grid_summaries(n: int, bandwidth: float, random_features: int | None = None, seed: int = 0
                   ) -> tuple[float, float, float, float, float]:
    """(a1, a2, a3, c, e) of the kernel (or random features) on the rank grid; data-free."""
    if random_features is None:
        return _gaussian_grid_summaries(int(n), float(bandwidth))
    return _rff_grid_summaries(int(n), float(bandwidth), int(random_features), int(seed))


def grid_null_moments(n: int, bandwidth_x: float, bandwidth_y: float, random_features: int | None = None,
                      feature_seed: int = 0) -> tuple[float, float]:
    """Exact permutation mean and variance of R_k for a private client of n rows (1-D, ties broken at random).

    Its U and V are permutations of the grid, and a1, a2, a3 are invariant under permutations, so the moments
    depend on n, the bandwidths and the feature seed only: the server computes them itself."""
    gx = grid_summaries(n, bandwidth_x, random_features, feature_seed)
    gy = grid_summaries(n, bandwidth_y, random_features, feature_seed + 1)
    return permutation_moments(gx[:3], gy[:3], n)


def root_statistic_sensitivity(n: int, bandwidth_x: float, bandwidth_y: float, random_features: int | None = None,
                               feature_seed: int = 0) -> float:
    """A proven bound on how much sqrt(R_k) moves when one record of a private client is replaced (1-D X, Y).

    Private mode ranks with ties broken by a uniform key per record, so U and V are permutations of the grid
    G = {1, ..., n} / (n + 1) (n is public: replace-one neighbours). Let phi be the kernel's feature map
    (k(u, u') = <phi(u), phi(u')>; for random features phi = z, the features themselves) and phi_bar the mean of
    phi over G. Since {u_i} = G as a set, the sample mean of phi(u_i) is phi_bar whatever the data, and

        sqrt(R) = ||sum_i (phi(u_i) - phi_bar) (x) (psi(v_i) - psi_bar)||_HS          (R = tr(K~ L~)).

    Replacing record j: for fixed tie-breaking keys every other record's rank moves by at most one (its rank
    counts the records below it, and only record j changed), so u_i and u'_i are equal or adjacent grid points.
    By the reverse triangle inequality and ||f (x) g|| = ||f|| ||g||,

        |sqrt(R) - sqrt(R')| <= 2 c_x c_y + sum_{i != j} (||phi(u_i) - phi(u'_i)|| c_y + c_x ||psi(v_i) - psi(v'_i)||)
                             <= 2 c_x c_y + (n - 1) (e_x c_y + c_x e_y),

    with c = max_{g in G} ||phi(g) - phi_bar|| and e = the largest distance ||phi(g) - phi(g')|| of adjacent grid
    points: for the Gaussian kernel e = sqrt(2 - 2 exp(-1 / (2 s^2 (n + 1)^2))) <= 1 / (s (n + 1)), so the bound
    tends to 2 c_x c_y + c_y / s_x + c_x / s_y, constant in n; for random features (a kernel with values in
    [-2, 2], not [0, 1]) c and e are computed from the features of G, a separate data-free bound. The mechanism
    (a mixture over keys of Gaussian mechanisms, each with this sensitivity) is then (epsilon, delta)-DP.
    """
    if n < 2:
        raise ValueError(f"n must be >= 2, got {n}")
    _, _, _, cx, ex = grid_summaries(n, bandwidth_x, random_features, feature_seed)
    _, _, _, cy, ey = grid_summaries(n, bandwidth_y, random_features, feature_seed + 1)
    # $$\Delta\sqrt{R} \le 2 c_x c_y + (n - 1)(e_x c_y + c_x e_y)$$
    return 2.0 * cx * cy + (n - 1) * (ex * cy + cx * ey)


def root_statistic(U: np.ndarray, V: np.ndarray, bandwidth_x: float, bandwidth_y: float,
                   random_features: int | None = None, feature_seed: int = 0) -> float:
    """sqrt(R_k) = sqrt(tr(K~ L~)) of a transformed sample (what a private client releases, before noise)."""
    if random_features is None:
        R = gram_statistics(gaussian_gram(U, bandwidth_x), gaussian_gram(V, bandwidth_y))[0]
    else:
        Phi = centred_features(U, bandwidth_x, random_features, feature_seed)[0]
        Psi = centred_features(V, bandwidth_y, random_features, feature_seed + 1)[0]
        R = float(np.sum((Phi.T @ Psi) ** 2))
    return math.sqrt(max(R, 0.0))
