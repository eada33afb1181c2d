r"""The evaluation, one implementation for every arm: deletion / insertion AUC, explanation drift, MI advantage.

**Deletion / insertion** (RISE conventions, fixed once; frgfm/torch-cam PR #419): groups are ranked by the
explanation, descending (ties: the smaller group index first). Deletion starts from x and replaces the top-s
groups by the baseline (the training mean); insertion starts from the baseline and restores the top-s groups of
x; s = 0..G, both endpoints included. The score is the model's probability of the class it predicted on x
(the class the explanation explains), and the area is the trapezoid rule against the actual fraction of
features changed. Lower deletion AUC and higher insertion AUC are better.

**Explanation drift index** (EDI): per client i and class c (true labels; a unit needs ``min_count`` test items),
m_{i,c} is the mean of client i's published explanations of its own items of class c; the reference is
ref_c = the mean of m_{i,c} over the clients holding c (each method against its *own* consensus, never against
its prior). $$\mathrm{EDI} = \mathrm{mean}_{i,c}\ \mathrm{JSD}(m_{i,c}\ \|\ \mathrm{ref}_c)$$ (bits).

**Membership-inference advantage** on shared artifacts: a shadow attack. Trials build a client dataset with
(b = 1) or without (b = 0, a fresh record of the same class in its place) a target record; the attacker fits a
logistic regression from artifact to b on training trials and guesses b on held-out trials; advantage =
TPR - FPR = 2 acc - 1 for balanced trials.

Example:
    >>> import numpy as np
    >>> from icml26.xfedalign.data import GroupSpec
    >>> groups = GroupSpec(((0,), (1,)), 2)
    >>> proba = lambda X: np.stack([1 - X[:, 0] * 0.8, X[:, 0] * 0.8], 1)   # class 1 reads feature 0 only
    >>> X = np.array([[1.0, 1.0]]); base = np.zeros(2)
    >>> good = deletion_insertion(proba, X, np.array([[1.0, 0.0]]), groups, base)
    >>> bad = deletion_insertion(proba, X, np.array([[0.0, 1.0]]), groups, base)
    >>> bool(good[0][0] < bad[0][0]), bool(good[1][0] > bad[1][0])
    (True, True)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from .core import _finite, jsd, normalize_rows
from .data import GroupSpec


def deletion_insertion(predict_proba: Callable[[np.ndarray], np.ndarray], X: np.ndarray, scores: np.ndarray,
                       groups: GroupSpec, baseline: np.ndarray, target: np.ndarray | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Per-item deletion and insertion AUCs (two (n,) arrays).

    Args:
        predict_proba: maps (m, d) inputs to (m, C) class probabilities.
        X: (n, d) items.
        scores: (n, G) explanation of each item (higher: more important).
        groups: the feature groups.
        baseline: (d,) the value a deleted feature takes.
        target: classes scored (default: the model's prediction on each item).
    """
    X = np.asarray(X, dtype=np.float64)
    scores = np.asarray(scores, dtype=np.float64)
    n, d = X.shape
    G = groups.n_groups
    if d != groups.n_features:
        raise ValueError(f"X has {d} features but the groups cover {groups.n_features}")
    if scores.shape != (n, G):
        raise ValueError(f"scores must be (n, G) = {(n, G)}, got {scores.shape}")
    if not np.isfinite(scores).all() or not np.isfinite(X).all():
        raise ValueError("X and scores must be finite")
    baseline = np.asarray(baseline, dtype=np.float64).reshape(-1)
    if baseline.shape != (d,):
        raise ValueError(f"baseline must have {d} values, got {baseline.shape}")
    if n == 0:
        return np.zeros(0), np.zeros(0)
    if target is None:
        target = np.asarray(predict_proba(X)).argmax(1)
    target = np.asarray(target)
    order = np.argsort(-scores, axis=1, kind="stable")                    # (n, G)
    M = groups.matrix()                                                   # (d, G)
    # keep[i, s, j] = 1 if feature j is among the top-s groups of item i
    ranked = M.T[order]                                                   # (n, G, d): group rows in rank order
    cum = np.concatenate([np.zeros((n, 1, d)), np.cumsum(ranked, axis=1)], axis=1)   # (n, G+1, d)
    frac = cum.sum(axis=2) / d                                            # features changed at each step
    deleted = X[:, None, :] * (1 - cum) + baseline * cum
    inserted = baseline * (1 - cum) + X[:, None, :] * cum
    rows = np.arange(n)[:, None]
    p_del = np.asarray(predict_proba(deleted.reshape(-1, d))).reshape(n, G + 1, -1)[rows, :, target[:, None]]
    p_ins = np.asarray(predict_proba(inserted.reshape(-1, d))).reshape(n, G + 1, -1)[rows, :, target[:, None]]
    p_del, p_ins = p_del.reshape(n, G + 1), p_ins.reshape(n, G + 1)
    return np.trapezoid(p_del, frac, axis=1), np.trapezoid(p_ins, frac, axis=1)


def greedy_oracle(predict_proba: Callable[[np.ndarray], np.ndarray], X: np.ndarray, groups: GroupSpec,
                  baseline: np.ndarray, target: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The ceiling: per item, the greedy order that deletes (inserts) the group lowering (raising) p most.

    Reads the metric itself, so it is a reference arm, never a method. Returns (deletion scores, insertion
    scores), each (n, G), to pass to ``deletion_insertion``.
    """
    X = np.asarray(X, dtype=np.float64)
    baseline = np.asarray(baseline, dtype=np.float64).reshape(-1)
    n, d = X.shape
    G = groups.n_groups
    if target is None:
        target = np.asarray(predict_proba(X)).argmax(1)
    M = groups.matrix().T.astype(bool)                                     # (G, d)
    out = []
    for insert in (False, True):
        scores = np.zeros((n, G))
        changed = np.zeros((n, d), dtype=bool)
        left = np.ones((n, G), dtype=bool)
        for step in range(G):
            cand = changed[:, None, :] | M[None, :, :]                     # (n, G, d)
            if insert:
                trial = np.where(cand, X[:, None, :], baseline)
            else:
                trial = np.where(cand, baseline, X[:, None, :])
            p = np.asarray(predict_proba(trial.reshape(-1, d))).reshape(n, G, -1)[np.arange(n), :, target]
            p = np.where(left, p, -np.inf if insert else np.inf)
            best = p.argmax(1) if insert else p.argmin(1)
            scores[np.arange(n), best] = G - step
            left[np.arange(n), best] = False
            changed |= M[best]
        out.append(scores)
    return out[0], out[1]


def drift_units(client_maps: Sequence[np.ndarray], client_labels: Sequence[np.ndarray], n_classes: int,
                min_count: int = 2) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """JSD(m_{i,c} || ref_c) for every (client, class) unit with ``min_count`` items, and the units' keys.

    Args:
        client_maps: per client, the (n_i, G) published explanations of its items.
        client_labels: per client, the (n_i,) true classes of those items.
        n_classes: C.
        min_count: fewest items of a class a client needs for its unit.

    Returns:
        (values, keys): one JSD per unit, in (client, class) order, and the [(client, class)] keys. The keys
        depend only on the labels, so every arm evaluated on the same items has the same units, in order.
    """
    if len(client_maps) != len(client_labels):
        raise ValueError("need one label array per client's maps")
    means: dict[tuple[int, int], np.ndarray] = {}
    for i, (maps, labels) in enumerate(zip(client_maps, client_labels, strict=True)):
        maps, labels = np.asarray(maps, dtype=np.float64), np.asarray(labels)
        for c in range(n_classes):
            rows = labels == c
            if rows.sum() >= min_count:
                means[(i, c)] = maps[rows].mean(0)
    keys = sorted(means)
    values = []
    for i, c in keys:
        ref = np.mean([means[k] for k in keys if k[1] == c], axis=0)
        values.append(float(jsd(means[(i, c)], ref)))
    return np.asarray(values), keys


def class_consensus(client_maps: Sequence[np.ndarray], client_labels: Sequence[np.ndarray], n_classes: int
                    ) -> np.ndarray:
    """The (C, G) reference map: per class, the mean of every client's explanations of its items of that class.

    Built from Local-XAI's explanations (beta = 0) it is the arm-independent consensus that ``drift_to_reference``
    measures every arm against; a class with no item gets a uniform row.
    """
    maps = np.concatenate([np.asarray(m, dtype=np.float64) for m in client_maps])
    labels = np.concatenate([np.asarray(y) for y in client_labels])
    if maps.ndim != 2 or len(maps) != len(labels):
        raise ValueError(f"need one (n_i, G) map array per client with one label per row, got {maps.shape} maps "
                         f"and {labels.shape} labels")
    G = maps.shape[1]
    out = np.full((n_classes, G), 1.0 / G)
    for c in range(n_classes):
        if (labels == c).any():
            out[c] = maps[labels == c].mean(0)
    return normalize_rows(out)


def drift_to_reference(client_maps: Sequence[np.ndarray], client_labels: Sequence[np.ndarray],
                       reference: np.ndarray, min_count: int = 2) -> tuple[np.ndarray, list[tuple[int, int]]]:
    r"""Drift that rewards agreement with the correct map: $$D_{i,c} = \mathrm{JSD}(m_{i,c}\,\|\,R_c)$$ per
    (client, class) unit, m_{i,c} the mean of client i's published explanations of its class-c items and R_c a
    fixed reference (``class_consensus`` of Local-XAI's explanations), the same for every arm.

    Unlike ``drift_units`` (each arm against its *own* consensus, so any shared map contracts it), mixing in a map
    moves D only as far as the map agrees with R_c: a wrong-class or uninformative map does not buy a reduction
    by being flat.

    Args:
        client_maps: per client, the (n_i, G) published explanations of its items.
        client_labels: per client, the (n_i,) true classes of those items.
        reference: (C, G) rows on the simplex.
        min_count: fewest items of a class a client needs for its unit.

    Returns:
        (values, keys) in (client, class) order; the keys are ``drift_units``' keys for the same labels.

    Example:
        >>> ref = np.array([[0.5, 0.5], [0.9, 0.1]])
        >>> v, keys = drift_to_reference([np.array([[0.5, 0.5], [0.5, 0.5]])], [np.array([0, 0])], ref)
        >>> v.tolist(), keys
        ([0.0], [(0, 0)])
    """
    ref = _finite("reference", np.asarray(reference, dtype=np.float64))
    if len(client_maps) != len(client_labels):
        raise ValueError("need one label array per client's maps")
    if ref.ndim != 2:
        raise ValueError(f"reference must be a (classes, groups) matrix, got shape {ref.shape}")
    values, keys = [], []
    for i, (maps, labels) in enumerate(zip(client_maps, client_labels, strict=True)):
        maps, labels = np.asarray(maps, dtype=np.float64), np.asarray(labels)
        for c in range(ref.shape[0]):
            rows = labels == c
            if rows.sum() >= min_count:
                keys.append((i, c))
                # $$D_{i,c} = \mathrm{JSD}(m_{i,c} \| R_c)$$
                values.append(float(jsd(maps[rows].mean(0), ref[c])))
    return np.asarray(values), keys


def match_entropy(P: np.ndarray, target: np.ndarray, *, iters: int = 100) -> np.ndarray:
    r"""Each row of ``P`` tempered, $$\tilde P_c \propto P_c^{1/t_c}$$, so that its entropy equals ``target``'s row
    (bisection on log t_c in [-8, 8]); the control that keeps a prior's ranking and changes only how flat it is.

    Example:
        >>> P = np.array([[0.7, 0.2, 0.1]]); T = np.array([[0.4, 0.35, 0.25]])
        >>> bool(abs(_entropy(match_entropy(P, T)) - _entropy(T)).max() < 1e-9)
        True
    """
    P = normalize_rows(np.maximum(_finite("P", np.asarray(P, dtype=np.float64)), 1e-12))
    T = normalize_rows(_finite("target", np.asarray(target, dtype=np.float64)))
    if P.shape != T.shape:
        raise ValueError(f"P and target must have the same shape, got {P.shape} and {T.shape}")
    out = np.empty_like(P)
    for c in range(len(P)):
        goal = float(_entropy(T[c : c + 1])[0])
        lo, hi = -8.0, 8.0                                  # log t: entropy rises with t
        for _ in range(iters):
            mid = 0.5 * (lo + hi)
            if _entropy(_temper(P[c : c + 1], mid))[0] < goal:
                lo = mid
            else:
                hi = mid
        out[c] = _temper(P[c : c + 1], 0.5 * (lo + hi))[0]
    return out


def _temper(P: np.ndarray, log_t: float) -> np.ndarray:
    L = np.log(P) / math.exp(log_t)
    L -= L.max(1, keepdims=True)
    return normalize_rows(np.exp(L))


def _entropy(P: np.ndarray) -> np.ndarray:
    P = np.asarray(P, dtype=np.float64)
    return -(P * np.log(np.where(P > 0, P, 1.0))).sum(1)


def explanation_drift_index(client_maps: Sequence[np.ndarray], client_labels: Sequence[np.ndarray],
                            n_classes: int, min_count: int = 2) -> float:
    """EDI: the mean of ``drift_units`` (bits)."""
    values, _ = drift_units(client_maps, client_labels, n_classes, min_count)
    if len(values) == 0:
        raise ValueError("no (client, class) unit has enough items")
    return float(values.mean())


def membership_attack(train_features: np.ndarray, train_members: np.ndarray, test_features: np.ndarray,
                      test_members: np.ndarray, *, return_scores: bool = False
                      ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """The shadow attack's per-trial 0/1 correctness on the held-out trials (logistic regression, standardised).

    A constant feature set (e.g. Local-XAI, which shares nothing) gives chance-level guesses (and constant
    scores). With ``return_scores`` also the attack's membership scores (P(member)) on the held-out trials, for
    ``auc_interval``.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    Xtr, Xte = np.asarray(train_features, dtype=np.float64), np.asarray(test_features, dtype=np.float64)
    ytr, yte = np.asarray(train_members).astype(int), np.asarray(test_members).astype(int)
    if len(np.unique(ytr)) < 2:
        raise ValueError("the attack's training trials need both members and non-members")
    if np.ptp(Xtr, axis=0).max(initial=0.0) == 0:
        guess = np.full(len(yte), int(np.round(ytr.mean())))
        scores = np.full(len(yte), float(ytr.mean()))
    else:
        clf = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=2000)).fit(Xtr, ytr)
        scores = clf.predict_proba(Xte)[:, 1]
        guess = clf.predict(Xte)
    correct = (guess == yte).astype(float)
    return (correct, scores) if return_scores else correct


def auc_interval(scores: np.ndarray, members: np.ndarray, *, z: float = 1.959963984540054
                 ) -> tuple[float, float, float]:
    r"""The attack's ROC AUC on held-out trials with a Hanley-McNeil normal interval.

    AUC = P(s_member > s_non) + P(tie)/2 (Mann-Whitney); with Q1 = A/(2 - A), Q2 = 2A^2/(1 + A),
    $$\mathrm{SE}^2 = \frac{A(1-A) + (n_1 - 1)(Q_1 - A^2) + (n_0 - 1)(Q_2 - A^2)}{n_1 n_0}$$
    and the interval A +- z SE, clipped to [0, 1].

    Args:
        scores: (n,) membership scores (higher: more likely a member).
        members: (n,) booleans, both classes present.
        z: the normal quantile (default: a two-sided 95 % interval).

    Returns:
        ``(auc, low, high)``.

    Example:
        >>> auc_interval(np.array([0.9, 0.8, 0.3, 0.1]), np.array([1, 1, 0, 0]))[0]
        1.0

    Reference: J. A. Hanley and B. J. McNeil, "The meaning and use of the area under a receiver operating
    characteristic (ROC) curve", Radiology 143, 1982.
    """
    s = _finite("scores", np.asarray(scores, dtype=np.float64))
    m = np.asarray(members).astype(bool)
    if s.ndim != 1 or m.shape != s.shape:
        raise ValueError(f"scores and members must be equal-length vectors, got {s.shape} and {m.shape}")
    pos, neg = s[m], s[~m]
    n1, n0 = len(pos), len(neg)
    if n1 == 0 or n0 == 0:
        raise ValueError("members must contain both members and non-members")
    # AUC = P(s+ > s-) + P(s+ = s-)/2 over all (member, non-member) pairs
    A = float(((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (n1 * n0))
    q1, q2 = A / (2 - A), 2 * A * A / (1 + A)
    se = math.sqrt(max(A * (1 - A) + (n1 - 1) * (q1 - A * A) + (n0 - 1) * (q2 - A * A), 0.0) / (n1 * n0))
    return A, max(0.0, A - z * se), min(1.0, A + z * se)


def advantage(correct: np.ndarray) -> float:
    """TPR - FPR of a balanced attack = 2 accuracy - 1."""
    return 2.0 * float(np.mean(correct)) - 1.0
