r"""A slow, literal float64 transcription of FedTreeLoRA's equations, for tests only.

No scipy, no sklearn, no torch: average-linkage agglomerative clustering by repeated merging of the closest
pair, the silhouette by its definition, the cut rule by enumeration, the expert averages and the mixed layer by
loops. ``tests/fedtreelora`` checks ``core`` and ``module`` against these.

    s(i) = (b(i) - a(i)) / max(a(i), b(i)),  a(i) = mean distance to its own cluster,
           b(i) = smallest mean distance to another cluster,  s(i) = 0 for a singleton
"""

from __future__ import annotations

import math

import numpy as np


def cosine_distance(x: np.ndarray, y: np.ndarray, eps: float = 1e-12) -> float:
    """1 - <x, y> / (max(|x|, eps) max(|y|, eps)) over the flattened matrices."""
    x, y = np.asarray(x, dtype=np.float64).ravel(), np.asarray(y, dtype=np.float64).ravel()
    nx = max(math.sqrt(sum(v * v for v in x)), eps)
    ny = max(math.sqrt(sum(v * v for v in y)), eps)
    return 1.0 - sum(a * b for a, b in zip(x, y, strict=True)) / (nx * ny)


def layer_distances(B: dict, eps: float = 1e-12) -> np.ndarray:
    """D^(l)_ij = mean over the layer's modules of 1 - cos(B_i, B_j)."""
    ids = list(B)
    n_layers = len(B[ids[0]])
    out = np.zeros((n_layers, len(ids), len(ids)))
    for layer in range(n_layers):
        for i, a in enumerate(ids):
            for j, b in enumerate(ids):
                if i != j:
                    mods = B[a][layer]
                    out[layer, i, j] = sum(cosine_distance(B[a][layer][m], B[b][layer][m], eps)
                                           for m in range(len(mods))) / len(mods)
    return out


def upgma_partitions(D: np.ndarray) -> dict[int, list[frozenset]]:
    """Average-linkage clustering by merging the closest pair of clusters; the partition at every count c."""
    n = len(D)
    clusters = [frozenset([i]) for i in range(n)]
    out = {n: list(clusters)}
    while len(clusters) > 1:
        best, pair = math.inf, None
        for i in range(len(clusters)):
            for j in range(i + 1, len(clusters)):
                d = sum(D[a, b] for a in clusters[i] for b in clusters[j]) / (len(clusters[i]) * len(clusters[j]))
                if d < best - 1e-12:
                    best, pair = d, (i, j)
        i, j = pair
        merged = clusters[i] | clusters[j]
        clusters = [c for k, c in enumerate(clusters) if k not in (i, j)] + [merged]
        out[len(clusters)] = list(clusters)
    return out


def silhouette(D: np.ndarray, partition: list[frozenset]) -> float:
    """The mean silhouette of a partition under the distance matrix D (singletons score 0)."""
    label = {i: k for k, block in enumerate(partition) for i in block}
    scores = []
    for i in range(len(D)):
        own = [j for j in partition[label[i]] if j != i]
        if not own:
            scores.append(0.0)
            continue
        a = sum(D[i, j] for j in own) / len(own)
        b = min(sum(D[i, j] for j in block) / len(block) for k, block in enumerate(partition) if k != label[i])
        scores.append((b - a) / max(a, b) if max(a, b) > 0 else 0.0)
    return sum(scores) / len(scores)


def layer_cuts(Dl: np.ndarray, tau: float, window: int) -> list[int]:
    """c*_l = argmax over {c : c*_{l-1} <= c < min(N, c*_{l-1} + K)} of (tau if c = 1 else the silhouette of
    cutting the tree of the layer-averaged distances into c clusters, scored on D^(l)); ties to the smaller c."""
    D = Dl.mean(axis=0)
    parts = upgma_partitions(D)
    n, prev, cuts = len(D), 1, []
    for Dlayer in Dl:
        best_c, best = None, -math.inf
        for c in range(prev, max(prev + 1, min(n, prev + window))):
            score = tau if c == 1 else silhouette(Dlayer, parts[c])
            if score > best:
                best_c, best = c, score
        prev = best_c
        cuts.append(prev)
    return cuts


def expert_means(states: dict, block: frozenset, weights: dict, key: str) -> np.ndarray:
    """sum_{j in block} w_j X_j / sum_{j in block} w_j in float64."""
    total = sum(weights[j] for j in block)
    return sum(weights[j] * np.asarray(states[j][key], dtype=np.float64) for j in block) / total


def mixed_lora_forward(x: np.ndarray, W0: np.ndarray, b0: np.ndarray | None, A: np.ndarray, B: np.ndarray,
                       A_ext: np.ndarray | None, B_ext: np.ndarray | None, logit: float, alpha: float) -> np.ndarray:
    """h = W0 x + b0 + (alpha / r) [lam B A x + (1 - lam) B_ext A_ext x], lam = 1 / (1 + e^-logit), row by row."""
    r = A.shape[0]
    s = alpha / r
    lam = 1.0 / (1.0 + math.exp(-logit)) if A_ext is not None else 1.0
    out = np.zeros((x.shape[0], W0.shape[0]))
    for n in range(x.shape[0]):
        xi = np.asarray(x[n], dtype=np.float64)
        h = np.asarray(W0, dtype=np.float64) @ xi + (0.0 if b0 is None else np.asarray(b0, dtype=np.float64))
        h = h + s * lam * (np.asarray(B, dtype=np.float64) @ (np.asarray(A, dtype=np.float64) @ xi))
        if A_ext is not None:
            h = h + s * (1.0 - lam) * (np.asarray(B_ext, dtype=np.float64) @ (np.asarray(A_ext, dtype=np.float64) @ xi))
        out[n] = h
    return out
