"""The baselines of the federated independence test, on the same clients: each returns a p-value.

- ``hsic_gamma_test``: the single-machine HSIC gamma test (z-scored data, Gaussian kernels); the building block
  and, on one client, the oracle shared with causal-learn's ``KCI_UInd``.
- ``pooled_hsic``: pool every client's raw rows (what a naive federated HSIC with a global kernel estimates).
- ``pooled_rank_hsic``: pool, then one global rank transform (the copula of the mixture, not of each client).
- ``copula_pooled``: within-client ranks, then one HSIC on the union (alignment without stacking).
- ``fisher`` / ``stouffer``: each client's own HSIC test on its ranks, p-values combined.
- ``stacked_raw``: the stacked statistic without alignment (raw data, per-client median-heuristic bandwidths).
- ``stacked_asymptotic``: the proposed test with the asymptotic (Gretton et al.) null moments instead of the exact
  permutation moments: the null of the first implementation, kept to show why it was replaced.

Every gamma null here uses the exact permutation moments (``core.permutation_moments``) unless a function says
otherwise, so the baselines and the proposed test share one null approximation.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=80); y = x ** 2 + 0.2 * rng.normal(size=80)
    >>> hsic_gamma_test(x, y) < 0.01
    True
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.stats

from .core import (
    aggregate,
    client_statistics,
    copula_transform,
    gamma_sf,
    gaussian_gram,
    gram_statistics,
    median_heuristic,
    null_moments,
    uniform_median_bandwidth,
)

Clients = Sequence[tuple[np.ndarray, np.ndarray]]


def _col(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    return a[:, None] if a.ndim == 1 else a


def hsic_gamma_test(x: np.ndarray, y: np.ndarray, bandwidth_x: float | None = None,
                    bandwidth_y: float | None = None, zscore: bool = True, moments: str = "permutation") -> float:
    """HSIC with the gamma null on one sample; bandwidths default to the median heuristic.

    ``moments="asymptotic"`` gives the gamma of Gretton et al. (2008) and causal-learn's ``KCI_UInd``."""
    x, y = _col(x), _col(y)
    if zscore:
        x = np.nan_to_num(scipy.stats.zscore(x, ddof=1, axis=0))
        y = np.nan_to_num(scipy.stats.zscore(y, ddof=1, axis=0))
    bx = median_heuristic(x) if bandwidth_x is None else bandwidth_x
    by = median_heuristic(y) if bandwidth_y is None else bandwidth_y
    stat, a, b = gram_statistics(gaussian_gram(x, bx), gaussian_gram(y, by))
    mean, var = null_moments(a, b, x.shape[0], moments)
    return gamma_sf(stat, mean, var)


def pooled_hsic(clients: Clients) -> float:
    """Raw rows of every client pooled into one HSIC gamma test."""
    x = np.vstack([_col(X) for X, _ in clients])
    y = np.vstack([_col(Y) for _, Y in clients])
    return hsic_gamma_test(x, y)


def pooled_rank_hsic(clients: Clients) -> float:
    """Pooled rows, one global rank transform, HSIC gamma test with the copula-scale bandwidth."""
    x = copula_transform(np.vstack([_col(X) for X, _ in clients]))
    y = copula_transform(np.vstack([_col(Y) for _, Y in clients]))
    return hsic_gamma_test(x, y, uniform_median_bandwidth(x.shape[1]), uniform_median_bandwidth(y.shape[1]),
                           zscore=False)


def copula_pooled(clients: Clients) -> float:
    """Within-client ranks (aligned marginals), then the union tested as one sample (no stacking)."""
    x = np.vstack([copula_transform(X) for X, _ in clients])
    y = np.vstack([copula_transform(Y) for _, Y in clients])
    return hsic_gamma_test(x, y, uniform_median_bandwidth(x.shape[1]), uniform_median_bandwidth(y.shape[1]),
                           zscore=False)


def local_pvalues(clients: Clients) -> list[float]:
    """Each client's own HSIC gamma test on its within-client ranks."""
    out = []
    for X, Y in clients:
        u, v = copula_transform(X), copula_transform(Y)
        out.append(hsic_gamma_test(u, v, uniform_median_bandwidth(u.shape[1]), uniform_median_bandwidth(v.shape[1]),
                                   zscore=False))
    return out


def fisher_combination(pvalues: Sequence[float]) -> float:
    """Fisher's method on given p-values: -2 sum log p_k ~ chi^2 with 2K degrees of freedom."""
    p = np.clip(np.asarray(pvalues, dtype=np.float64), 1e-300, 1.0)
    return float(scipy.stats.chi2.sf(-2.0 * np.sum(np.log(p)), 2 * len(p)))


def stouffer_combination(pvalues: Sequence[float]) -> float:
    """Stouffer's method on given p-values: sum Phi^-1(1 - p_k) / sqrt(K) ~ N(0, 1)."""
    p = np.clip(np.asarray(pvalues, dtype=np.float64), 1e-300, 1 - 1e-16)
    return float(scipy.stats.norm.sf(np.sum(scipy.stats.norm.isf(p)) / np.sqrt(len(p))))


def fisher(clients: Clients) -> float:
    """Fisher's combination of the clients' own tests (``local_pvalues``)."""
    return fisher_combination(local_pvalues(clients))


def stouffer(clients: Clients) -> float:
    """Stouffer's combination of the clients' own tests (``local_pvalues``)."""
    return stouffer_combination(local_pvalues(clients))


def stacked_asymptotic(clients: Clients) -> float:
    """Copula alignment and stacking as proposed, but the gamma null from the asymptotic moments
    tr(K~)tr(L~)/n and 2||K~||^2||L~||^2/n^2 per client (the first implementation's null)."""
    stats = []
    for X, Y in clients:
        u, v = copula_transform(X), copula_transform(Y)
        stats.append(client_statistics(u, v, uniform_median_bandwidth(u.shape[1]), uniform_median_bandwidth(v.shape[1]),
                                       moments="asymptotic"))
    return aggregate(stats).pvalue


def stacked_raw(clients: Clients) -> float:
    """The stacked statistic and gamma null on raw data (no copula alignment)."""
    stats = [client_statistics(_col(X), _col(Y), median_heuristic(_col(X)), median_heuristic(_col(Y)))
             for X, Y in clients]
    return aggregate(stats).pvalue


BASELINES = {"pooled": pooled_hsic, "pooled_rank": pooled_rank_hsic, "copula_pooled": copula_pooled,
             "fisher": fisher, "stouffer": stouffer, "stacked_raw": stacked_raw}
