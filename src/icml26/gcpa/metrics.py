"""Metrics of multi-way alignment: any-to-any retrieval, stitching, geometry distortion.

All take a fitted aligner (anything with ``embed_pair(X_src, X_dst, src, dst)`` and ``preprocess(X, view)``) and
evaluate every ordered pair of models (src, dst), src != dst, on held-out rows.

- Retrieval: each held-out item of model src queries model dst's held-out items by cosine similarity; its match
  is the same item. Recall@k and MRR, ties broken by index order (deterministic), averaged over all pairs;
  ``retrieval_per_item`` gives each item's Recall@k over the pairs (the per-unit values of the reproduction).
- Stitching: a logistic-regression head trained on model dst's (aligned) training embeddings classifies model
  src's held-out embeddings mapped into the same space; accuracy averaged over all pairs (``stitching_correct``
  gives the 0/1 outcome of every item on every pair).
- Geometry distortion: how much the map changes a model's internal geometry, the distance between the
  normalised vectors of pairwise distances before (preprocessed) and after alignment; 0 for any similarity
  transform, at most sqrt(2).

Example:
    >>> import numpy as np
    >>> from icml26.gcpa import GeneralizedProcrustes
    >>> rng = np.random.default_rng(0)
    >>> Z = rng.normal(size=(120, 4))
    >>> isometries = [np.linalg.qr(rng.normal(size=(6, 6)))[0][:4] for _ in range(3)]  # 4-d into 6-d
    >>> views = [Z @ Q for Q in isometries]
    >>> model = GeneralizedProcrustes(n_components=4).fit(views)
    >>> any_to_any_retrieval(model, views)["recall@1"]
    1.0
    >>> round(geometry_distortion(model, views), 12)
    0.0
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.spatial.distance import pdist


def _normalise_rows(Z: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(Z, axis=1, keepdims=True)
    return Z / np.where(norms == 0, 1.0, norms)


def pair_ranks(queries: np.ndarray, database: np.ndarray) -> np.ndarray:
    """Rank (0 = first) of each query's match, database item i for query i, by cosine similarity.

    Ties are broken by index order: an equal-scoring item with a smaller index ranks first (deterministic).
    """
    if queries.shape != database.shape:
        raise ValueError(
            f"queries and database must have the same shape, got {queries.shape}, {database.shape}"
        )
    sims = _normalise_rows(queries) @ _normalise_rows(database).T
    correct = np.diag(sims)[:, None]
    n = sims.shape[0]
    earlier = np.arange(n)[None, :] < np.arange(n)[:, None]
    return (sims > correct).sum(axis=1) + ((sims == correct) & earlier).sum(axis=1)


def pair_retrieval(queries: np.ndarray, database: np.ndarray, ks: Sequence[int] = (1, 5)) -> dict[str, float]:
    """Recall@k and MRR when query i's correct match is database item i (cosine similarity)."""
    rank = pair_ranks(queries, database)
    out = {f"recall@{k}": float(np.mean(rank < k)) for k in ks}
    out["mrr"] = float(np.mean(1.0 / (rank + 1)))
    return out


class _Pairs:
    """``embed_pair`` over one list of views, computing each view's embedding once for shared-space models.

    A model whose ``embed_pair`` is the shared-space default (every model mapped into one space, independently
    of its partner) gets ``transform(X_m, view=m)`` once per view; pairwise models are asked pair by pair.
    """

    def __init__(self, model: Any, Xs: Sequence[np.ndarray]):
        from .estimators import _MultiView

        self.model, self.Xs = model, Xs
        self.shared = getattr(type(model), "embed_pair", None) is _MultiView.embed_pair
        self._cache: dict[int, np.ndarray] = {}

    def _one(self, m: int) -> np.ndarray:
        if m not in self._cache:
            self._cache[m] = self.model.transform(self.Xs[m], view=m)
        return self._cache[m]

    def __call__(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        if self.shared:
            return self._one(a), self._one(b)
        return self.model.embed_pair(self.Xs[a], self.Xs[b], a, b)


def any_to_any_ranks(model: Any, Xs_test: Sequence[np.ndarray]) -> np.ndarray:
    """``(M (M - 1), n)`` ranks of each held-out item's match, one row per ordered model pair (src, dst)."""
    rows = []
    pairs = _Pairs(model, Xs_test)
    for a, b in itertools.permutations(range(len(Xs_test)), 2):
        Za, Zb = pairs(a, b)
        rows.append(pair_ranks(Za, Zb))
    return np.asarray(rows)


def retrieval_per_item(ranks: np.ndarray, k: int = 1) -> np.ndarray:
    """Each held-out item's Recall@k over the ordered model pairs (``ranks`` from ``any_to_any_ranks``).

    Its mean over items is the any-to-any Recall@k (every pair has the same items).
    """
    return (np.asarray(ranks) < k).mean(axis=0)


def any_to_any_retrieval(
    model: Any, Xs_test: Sequence[np.ndarray], ks: Sequence[int] = (1, 5)
) -> dict[str, float]:
    """Retrieval metrics averaged over all M (M - 1) ordered pairs of models."""
    ranks = any_to_any_ranks(model, Xs_test)
    scores = [
        {**{f"recall@{k}": float(np.mean(r < k)) for k in ks}, "mrr": float(np.mean(1.0 / (r + 1)))}
        for r in ranks
    ]
    return {key: float(np.mean([s[key] for s in scores])) for key in scores[0]}


def stitching_correct(
    model: Any,
    Xs_train: Sequence[np.ndarray],
    Xs_test: Sequence[np.ndarray],
    y_train: np.ndarray,
    y_test: np.ndarray,
    *,
    seed: int = 0,
) -> np.ndarray:
    """``(M (M - 1), n)``: 1 where dst's head classifies src's mapped held-out item correctly, per ordered pair."""
    from sklearn.linear_model import LogisticRegression

    heads: dict[Any, Any] = {}
    rows = []
    train_pairs, test_pairs = _Pairs(model, Xs_train), _Pairs(model, Xs_test)
    for a, b in itertools.permutations(range(len(Xs_test)), 2):
        # the head lives in the space where (a, b) are compared: dst's side of the pair, fitted on train rows
        _, Zb_train = train_pairs(a, b)
        key = (b, Zb_train.shape, hashlib.sha1(Zb_train.tobytes()).hexdigest())  # same space -> same head
        if key not in heads:
            heads[key] = LogisticRegression(max_iter=2000, random_state=seed).fit(Zb_train, y_train)
        Za_test, _ = test_pairs(a, b)
        rows.append((heads[key].predict(Za_test) == np.asarray(y_test)).astype(float))
    return np.asarray(rows)


def stitching_accuracy(
    model: Any,
    Xs_train: Sequence[np.ndarray],
    Xs_test: Sequence[np.ndarray],
    y_train: np.ndarray,
    y_test: np.ndarray,
    *,
    seed: int = 0,
) -> float:
    """Mean accuracy of dst's head applied to src's mapped embeddings, over all ordered pairs (src, dst)."""
    return float(stitching_correct(model, Xs_train, Xs_test, y_train, y_test, seed=seed).mean())


def distance_distortion(X: np.ndarray, Z: np.ndarray) -> float:
    """|| d(X)/||d(X)|| - d(Z)/||d(Z)|| ||, d the vector of pairwise Euclidean distances (0 for similarities)."""
    dx, dz = pdist(X), pdist(Z)
    nx, nz = np.linalg.norm(dx), np.linalg.norm(dz)
    if nx == 0 or nz == 0:
        return float("nan")
    return float(np.linalg.norm(dx / nx - dz / nz))


def geometry_distortion(model: Any, Xs_test: Sequence[np.ndarray], *, max_rows: int = 400) -> float:
    """Mean distortion of each source model's geometry by its map, over all ordered pairs (first ``max_rows``)."""
    out = []
    pairs = _Pairs(model, [X[:max_rows] for X in Xs_test])
    per_source: dict[int, float] = {}  # shared-space models: the source's map does not depend on the partner
    for a, b in itertools.permutations(range(len(Xs_test)), 2):
        if pairs.shared and a in per_source:
            out.append(per_source[a])
            continue
        Za, _ = pairs(a, b)
        per_source[a] = distance_distortion(model.preprocess(pairs.Xs[a], a), Za)
        out.append(per_source[a])
    return float(np.mean(out))
