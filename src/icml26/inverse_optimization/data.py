"""Environments of the reproduction (generated from a seed) and the simulation loop.

Each environment draws w* ~ U[0, 1]^d, normalised to the unit ball, and a fresh M-convex feasible set every
round:

- ``topk``: a uniform matroid, k_t of a random available set S_t (a top-k recommendation);
- ``pairs``: one of two available items (pairwise comparisons);
- ``partition``: a partition matroid, c_g items from each group of a random partition;
- ``graphic``: spanning trees of a random connected subgraph of K_n (d = n (n - 1) / 2 edges).

The agent answers argmax <w*, x>; in corrupted rounds it reveals the worst action, argmin <w*, x>, instead.
Regret is always measured against the true optimum with w*.

``adaptive_pairs`` is the adversarial stream: every round it shows the pair {i, j} (choose one of two) that the
learner currently gets wrong with the smallest gap |w*_i - w*_j|, so every round is a mistake, until the learner
orders every pair as w* does (then no feasible set of this kind can make it err again, and the run stops).

Example:
    >>> env = Environment("topk", d=6, seed=0)
    >>> X = env.draw()
    >>> X.d, bool(X.contains(X.argmax(env.w_star)))
    (6, True)
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ..common.progress import progress
from .action_sets import ActionSet, GraphicMatroid, PartitionMatroid, UniformMatroid

KINDS = ("topk", "pairs", "partition", "graphic")


class Environment:
    """A stream of M-convex feasible sets with a hidden objective ``w_star`` (seeded)."""

    def __init__(self, kind: str, d: int, seed: int):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if kind == "graphic":
            n = (1 + math.isqrt(1 + 8 * d)) // 2
            if n * (n - 1) // 2 != d:
                raise ValueError(f"graphic environments need d = n(n-1)/2 (6, 10, 15, ...), got {d}")
            self.n_nodes = n
            self.edges = [(u, v) for u in range(n) for v in range(u + 1, n)]
        if d < 2:
            raise ValueError(f"d must be >= 2, got {d}")
        self.kind, self.d = kind, d
        self.rng = np.random.default_rng(seed)
        w = self.rng.uniform(0.0, 1.0, size=d)
        self.w_star = w / np.linalg.norm(w)

    @property
    def diameter(self) -> float:
        """K: an upper bound on ||x - x'|| over any round's feasible set (for ONS / OGD's constants)."""
        rank = {"topk": self.d - 1, "pairs": 1, "partition": self.d // 2,
                "graphic": getattr(self, "n_nodes", 2) - 1}[self.kind]
        return math.sqrt(2.0 * max(rank, 1))

    def draw(self) -> ActionSet:
        d, rng = self.d, self.rng
        if self.kind == "topk":
            size = int(rng.integers(2, d + 1))
            available = rng.choice(d, size=size, replace=False)
            return UniformMatroid(d, available, int(rng.integers(1, size)))
        if self.kind == "pairs":
            return UniformMatroid(d, rng.choice(d, size=2, replace=False), 1)
        if self.kind == "partition":
            perm = rng.permutation(d)
            n_groups = int(rng.integers(1, max(2, d // 2) + 1))
            groups = [g for g in np.array_split(perm, n_groups) if len(g) >= 2]
            if not groups:
                groups = [perm]
            return PartitionMatroid(d, groups, [int(rng.integers(1, len(g))) for g in groups])
        # graphic: a random spanning tree of K_n plus random extra edges keeps the subgraph connected
        order = rng.permutation(self.n_nodes)
        tree = {self.edges.index(tuple(sorted((int(order[i]), int(order[rng.integers(0, i)])))))
                for i in range(1, self.n_nodes)}
        extra = {int(e) for e in rng.choice(d, size=int(rng.integers(1, d + 1)), replace=False)}
        return GraphicMatroid(self.n_nodes, self.edges, sorted(tree | extra))


def adaptive_pairs(d: int, seed: int, learner: object, max_rounds: int) -> tuple[int, float]:
    """Run ``learner`` against the smallest-gap wrong-pair adversary; return (mistakes, cumulative regret).

    w* is the one ``Environment("pairs", d, seed)`` draws. Each round the adversary asks the learner's prediction on
    every pair (ties broken as the learner breaks them), keeps the pairs it gets wrong, and shows the one with the
    smallest gap (ties by the lower pair index); the agent answers it honestly.
    """
    w = Environment("pairs", d, seed).w_star
    pairs = [(i, j) for i in range(d) for j in range(i + 1, d)]
    sets = [UniformMatroid(d, [i, j], 1) for i, j in pairs]
    mistakes, regret = 0, 0.0
    for _ in range(max_rounds):
        wrong = []
        for k, ((i, j), X) in enumerate(zip(pairs, sets, strict=True)):
            pick = int(np.flatnonzero(learner.predict(X))[0])
            other = j if pick == i else i
            if w[other] > w[pick]:
                wrong.append((w[other] - w[pick], k))
        if not wrong:
            break
        gap, k = min(wrong)
        X = sets[k]
        # $$r_t = \langle w^*, x_t - \hat x_t \rangle$$  (the learner's pick on this pair is the wrong one)
        regret += float(gap)
        mistakes += 1
        learner.update(X, X.argmax(w))
    return mistakes, regret


def simulate(kind: str, d: int, seed: int, learners: Mapping[str, object], T: int,
             corrupted: set[int] | frozenset[int] = frozenset(), desc: str | None = None) -> dict[str, np.ndarray]:
    """Run every learner on the same stream; return each one's cumulative regret after each round."""
    env = Environment(kind, d, seed)
    regret = {name: np.zeros(T) for name in learners}
    running = dict.fromkeys(learners, 0.0)
    rounds = progress(range(T), desc=desc) if desc else range(T)
    for t in rounds:
        X = env.draw()
        best = X.argmax(env.w_star)
        shown = X.argmin(env.w_star) if t in corrupted else best
        value = float(env.w_star @ best)
        for name, learner in learners.items():
            guess = learner.predict(X)
            # $$r_t = \langle w^*, x_t - \hat x_t \rangle$$   (against the true optimum, even when corrupted)
            running[name] += value - float(env.w_star @ guess)
            regret[name][t] = running[name]
            learner.update(X, shown)
    return regret
