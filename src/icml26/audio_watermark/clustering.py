"""The reduced vocabulary: community detection on the codec's round-trip confusion graph (and the baselines).

``RoundTripConfusion`` counts, over unlabelled audio, how often token i comes back as token j != i after
encode -> decode -> re-encode (mismatches only; mergeable by summing). ``ConfusionGraphClusterer`` (an sklearn-style
estimator) zeroes counts below ``min_count``, builds a directed weighted graph and runs Leiden (leidenalg,
RB-configuration, ``resolution``) or Louvain (networkx); ``min_clusters`` raises the resolution (doubling) until
at least that many clusters exist, so the key space C^h does not collapse. Baselines with the same number of
clusters: k-means on the codebook vectors (``kmeans_clusters``) and a random partition with the same cluster-size
histogram (``random_partition``). ``select_resolution`` picks one resolution per RVQ level on held-out round trips
by the paper's E[z] of its own counting (``predicted_strength``). A fitted map is saved with the codec's fingerprint and refuses another codec.

Example:
    >>> import numpy as np
    >>> M = np.zeros((6, 6)); M[0, 1] = M[1, 0] = M[2, 3] = M[3, 2] = M[4, 5] = M[5, 4] = 10
    >>> ConfusionGraphClusterer(min_count=1, resolution=1.0).fit(M).n_clusters_
    3
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from sklearn.base import BaseEstimator

from ..common.io import atomic_write_text
from ..common.optional import requires


class RoundTripConfusion:
    """Mismatch counts ``M[i, j]`` (i != j) of round trips; ``match_rate()`` = share of tokens that survive."""

    def __init__(self, vocab_size: int):
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
        self.V = vocab_size
        self.M = np.zeros((vocab_size, vocab_size), dtype=np.int64)
        self.total = 0
        self.matched = 0

    def update(self, orig: np.ndarray, roundtrip: np.ndarray) -> RoundTripConfusion:
        a, b = np.asarray(orig), np.asarray(roundtrip)
        n = min(len(a), len(b))
        a, b = a[:n], b[:n]
        if n and (a.min() < 0 or b.min() < 0 or a.max() >= self.V or b.max() >= self.V):
            raise ValueError(f"tokens must be in [0, {self.V})")
        miss = a != b
        np.add.at(self.M, (a[miss], b[miss]), 1)
        self.total += n
        self.matched += int((~miss).sum())
        return self

    def __add__(self, other: RoundTripConfusion) -> RoundTripConfusion:
        if other.V != self.V:
            raise ValueError("cannot merge confusion matrices of different vocabularies")
        out = RoundTripConfusion(self.V)
        out.M, out.total, out.matched = (
            self.M + other.M,
            self.total + other.total,
            self.matched + other.matched,
        )
        return out

    def match_rate(self) -> float:
        return self.matched / max(self.total, 1)


class ConfusionGraphClusterer(BaseEstimator):
    """Communities of the confusion graph (see the module docstring)."""

    def __init__(
        self,
        method: str = "leiden",
        min_count: int = 1,
        resolution: float = 1.0,
        directed: bool = True,
        seed: int = 27,
        min_clusters: int | None = None,
    ):
        self.method, self.min_count, self.resolution = method, min_count, resolution
        self.directed, self.seed, self.min_clusters = directed, seed, min_clusters

    def _communities(self, W: np.ndarray, resolution: float) -> np.ndarray:
        V = W.shape[0]
        if self.method == "leiden":
            ig = requires("igraph", extra="audio", purpose="the confusion graph")
            la = requires("leidenalg", extra="audio", purpose="Leiden community detection")
            src, dst = np.nonzero(W)
            g = ig.Graph(
                n=V, edges=list(zip(src.tolist(), dst.tolist(), strict=True)), directed=self.directed
            )
            g.es["weight"] = W[src, dst].astype(float).tolist()
            part = la.find_partition(
                g,
                la.RBConfigurationVertexPartition,
                weights="weight",
                resolution_parameter=resolution,
                seed=self.seed,
            )
            return np.asarray(part.membership)
        if self.method == "louvain":
            nx = requires("networkx", extra="audio", purpose="Louvain community detection")
            g = nx.Graph()
            g.add_nodes_from(range(V))
            sym = W + W.T
            for i, j in zip(*np.nonzero(np.triu(sym, 1)), strict=True):
                g.add_edge(int(i), int(j), weight=float(sym[i, j]))
            labels = np.zeros(V, dtype=int)
            for c, members in enumerate(
                nx.community.louvain_communities(g, weight="weight", resolution=resolution, seed=self.seed)
            ):
                labels[list(members)] = c
            return labels
        raise ValueError(f"method must be 'leiden' or 'louvain', got {self.method!r}")

    def fit(self, M: np.ndarray, y: object = None) -> ConfusionGraphClusterer:
        M = np.asarray(M, dtype=float)
        if M.ndim != 2 or M.shape[0] != M.shape[1] or (M < 0).any() or not np.isfinite(M).all():
            raise ValueError(f"M must be a square non-negative count matrix, got shape {M.shape}")
        if self.min_count < 0 or self.resolution <= 0:
            raise ValueError("min_count must be >= 0 and resolution > 0")
        W = np.where(M >= self.min_count, M, 0.0)
        np.fill_diagonal(W, 0.0)
        res = self.resolution
        labels = self._communities(W, res)
        while self.min_clusters and len(np.unique(labels)) < self.min_clusters and res < 1e4:
            res *= 2.0
            labels = self._communities(W, res)
        _, self.labels_ = np.unique(labels, return_inverse=True)
        self.n_clusters_ = int(self.labels_.max()) + 1
        self.resolution_used_ = res
        return self

    def transform(self, tokens: np.ndarray) -> np.ndarray:
        return self.labels_[np.asarray(tokens)]

    def cluster_match_rate(self, orig: np.ndarray, roundtrip: np.ndarray) -> float:
        """r_cl: share of aligned positions whose cluster survives the round trip."""
        return cluster_match_rate(self.labels_, orig, roundtrip)


def cluster_match_rate(labels: np.ndarray, orig: np.ndarray, roundtrip: np.ndarray) -> float:
    """Share of aligned positions (the shorter length) where ``labels[orig] == labels[roundtrip]``; with the
    identity map this is the token match rate r."""
    n = min(len(orig), len(roundtrip))
    return float((labels[np.asarray(orig)[:n]] == labels[np.asarray(roundtrip)[:n]]).mean())


def predicted_strength(
    labels: np.ndarray, pairs: Sequence[tuple[np.ndarray, np.ndarray]], h: int = 0, gamma: float = 0.25
) -> float:
    """The paper's E[z] of its own counting on round-trip data, up to the factor (g - gamma) / sqrt(gamma (1 - gamma)).

    E[z | H1] = sqrt(N) (g - gamma) / sqrt(gamma (1 - gamma)) r^(h+1) (the paper's analysis) counts N independent
    units; with each token value scored once and green status taken from the token's cluster, the w_c distinct
    tokens of cluster c share one green draw, so the null's variance is gamma (1 - gamma) sum_c w_c^2 and sqrt(N)
    becomes the effective count N / sqrt(sum_c w_c^2). Per level, on held-out round trips (orig, roundtrip):

        strength = r_cl^(h+1) * mean over clips of  N / sqrt(sum_c w_c^2),   w_c = distinct re-encoded tokens in c

    Coarse clusters raise r_cl and lower the effective count; the identity map gives r^(h+1) sqrt(N). A map whose
    green list would hold every cluster (``max(1, round(gamma C)) >= C``, e.g. one cluster) carries no watermark
    (g = gamma = 1) and scores 0. The factor (g - gamma) is taken as the same for every C (it depends on the LM).

    Args:
        labels: ``(V,)`` token -> cluster map of one level.
        pairs: ``(orig, roundtrip)`` token arrays of that level, one pair per held-out clip.
        h: context width (the survival exponent h + 1; the units are grouped as at h = 0).
        gamma: nominal green share (``ClusteredKGW``'s ``n_green = max(1, round(gamma C))``).

    Returns:
        The predicted strength (higher is better).

    Example:
        >>> import numpy as np
        >>> pairs = [(np.array([0, 1, 2, 3]), np.array([1, 0, 2, 3]))]
        >>> predicted_strength(np.arange(4), pairs)  # r = 1/2, 4 independent units: 0.5 * sqrt(4)
        1.0
        >>> round(predicted_strength(np.array([0, 0, 1, 1]), pairs), 4)  # r_cl = 1, two draws of 2: 4 / sqrt(8)
        1.4142
    """
    labels = np.asarray(labels)
    if not pairs:
        raise ValueError("pairs must hold at least one (orig, roundtrip) clip")
    C = int(labels.max()) + 1
    if max(1, round(gamma * C)) >= C:  # every cluster green: no watermark signal
        return 0.0
    r = float(np.mean([cluster_match_rate(labels, a, b) for a, b in pairs]))
    eff = []
    for _, b in pairs:
        w = np.bincount(labels[np.unique(np.asarray(b))])
        # sqrt(N) -> N / sqrt(sum_c w_c^2): the distinct tokens of one cluster share one green draw
        eff.append(w.sum() / np.sqrt((w.astype(float) ** 2).sum()))
    # strength = r_cl^(h+1) * N_eff^(1/2)
    return r ** (h + 1) * float(np.mean(eff))


def select_resolution(
    M_fit: np.ndarray,
    val_pairs: Sequence[tuple[np.ndarray, np.ndarray]],
    grid: Sequence[float],
    *,
    method: str = "leiden",
    h: int = 0,
    min_count: int = 1,
    gamma: float = 0.25,
) -> tuple[float, dict[float, tuple[int, float]]]:
    """The resolution of ``grid`` whose clusters of ``M_fit`` (round trips of fitting clips) maximise
    ``predicted_strength`` on other, held-out round trips (the paper's remedy: a resolution per RVQ level, chosen on
    round-trip data, here by the paper's own E[z]); ties go to the first (coarsest) resolution.

    Args:
        M_fit: mismatch counts of the fitting clips.
        val_pairs: ``(orig, roundtrip)`` of validation clips disjoint from the fitting clips and from every test unit.
        grid: resolutions to try (increasing).
        method: ``"leiden"`` or ``"louvain"``.
        h: context width of the test.
        min_count: the graph's count threshold.
        gamma: nominal green share.

    Returns:
        ``(chosen resolution, {resolution: (clusters, strength)})``.

    Example:
        >>> import numpy as np
        >>> M = np.zeros((4, 4)); M[0, 1] = M[1, 0] = M[2, 3] = M[3, 2] = 5
        >>> select_resolution(M, [(np.array([0, 2]), np.array([1, 3]))], [0.5, 1.0])[0]
        0.5
    """
    if not len(grid) or any(g <= 0 for g in grid):
        raise ValueError(f"grid must hold positive resolutions, got {list(grid)}")
    table = {}
    for res in grid:
        labels = ConfusionGraphClusterer(method=method, min_count=min_count, resolution=float(res)).fit(M_fit).labels_
        table[float(res)] = (int(labels.max()) + 1, predicted_strength(labels, val_pairs, h, gamma))
    best = max(table.values(), key=lambda v: v[1])[1]
    return next(r for r, v in table.items() if v[1] == best), table


def kmeans_clusters(codebook: np.ndarray, n_clusters: int, seed: int = 0) -> np.ndarray:
    """k-means on the codebook vectors (the "semantic" clustering the paper argues against)."""
    from sklearn.cluster import KMeans

    return KMeans(n_clusters=n_clusters, n_init=10, random_state=seed).fit_predict(codebook)


def random_partition(labels: np.ndarray, seed: int = 0) -> np.ndarray:
    """A random partition with the same cluster-size histogram as ``labels``."""
    rng = np.random.default_rng(seed)
    return np.asarray(labels)[rng.permutation(len(labels))]


def save_cluster_map(labels: np.ndarray, path: str | Path, *, codec_fingerprint: str) -> Path:
    """Write a cluster map (JSON) tied to a codec."""
    p = Path(path)
    atomic_write_text(p, json.dumps({"codec": codec_fingerprint, "labels": [int(v) for v in labels]}))
    return p


def load_cluster_map(path: str | Path, *, codec_fingerprint: str) -> np.ndarray:
    """Read a cluster map; ``ValueError`` when it was built for another codec."""
    data = json.loads(Path(path).read_text())
    if data.get("codec") != codec_fingerprint:
        raise ValueError(
            f"the cluster map in {path} was built for codec {data.get('codec')!r}, not {codec_fingerprint!r}"
        )
    return np.asarray(data["labels"], dtype=np.int64)
