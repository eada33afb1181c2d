"""M-convex feasible sets given as matroid base oracles: uniform, partition and graphic matroids.

An action is a 0/1 vector x in {0, 1}^d (a base of the matroid). Every set here is M-convex, so linear
optimisation is greedy and optimality is local: x maximises <w, x> over the set iff w_i >= w_j for every
exchange pair (i, j), i.e. every i in x, j not in x with x - e_i + e_j feasible. That characterisation turns an
observed optimal action into pairwise order constraints on w.

Example:
    >>> import numpy as np
    >>> S = UniformMatroid(d=5, available=[0, 2, 3, 4], k=2)
    >>> S.argmax(np.array([0.9, 1.0, 0.1, 0.5, 0.7])).tolist()
    [1, 0, 0, 0, 1]
    >>> sorted(S.exchange_pairs(np.array([1, 0, 0, 0, 1])))
    [(0, 2), (0, 3), (4, 2), (4, 3)]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

import numpy as np


class ActionSet(Protocol):
    """An M-convex feasible set of 0/1 vectors in dimension ``d``."""

    d: int

    def argmax(self, w: np.ndarray) -> np.ndarray:
        """A maximiser of <w, x> (greedy; ties broken by the lower index)."""

    def contains(self, x: np.ndarray) -> bool:
        """Whether ``x`` is a feasible action."""

    def exchange_pairs(self, x: np.ndarray) -> Iterable[tuple[int, int]]:
        """Pairs (i, j) with x_i = 1, x_j = 0 and x - e_i + e_j feasible."""


def _order(w: np.ndarray, items: Sequence[int]) -> list[int]:
    """``items`` by decreasing weight, ties by increasing index (deterministic greedy)."""
    wl = w.tolist()                       # Python floats: the same values, compared without NumPy scalars
    return sorted(items, key=lambda i: (-wl[i], i))


def _check_w(w: np.ndarray, d: int) -> np.ndarray:
    w = np.asarray(w, dtype=np.float64)
    if w.shape != (d,):
        raise ValueError(f"w must have shape ({d},), got {w.shape}")
    return w


def _check_x(x: np.ndarray, d: int) -> np.ndarray:
    x = np.asarray(x)
    if x.shape != (d,):
        raise ValueError(f"an action must have shape ({d},), got {x.shape}")
    if not np.all((x == 0) | (x == 1)):
        raise ValueError("an action must be a 0/1 vector")
    return x.astype(np.int64)


class UniformMatroid:
    """Choose exactly ``k`` of the ``available`` items (a top-k recommendation)."""

    def __init__(self, d: int, available: Sequence[int], k: int):
        available = sorted(set(int(i) for i in available))
        if d < 1 or not available or not all(0 <= i < d for i in available):
            raise ValueError(f"available must be a non-empty subset of range({d}), got {available}")
        if not 1 <= k <= len(available):
            raise ValueError(f"k must be in [1, {len(available)}], got {k}")
        self.d, self.available, self.k = d, available, k

    def argmax(self, w: np.ndarray) -> np.ndarray:
        w = _check_w(w, self.d)
        x = np.zeros(self.d, dtype=np.int64)
        x[_order(w, self.available)[: self.k]] = 1
        return x

    def argmin(self, w: np.ndarray) -> np.ndarray:
        return self.argmax(-_check_w(w, self.d))

    def contains(self, x: np.ndarray) -> bool:
        x = _check_x(x, self.d)
        support = set(np.flatnonzero(x).tolist())
        return len(support) == self.k and support <= set(self.available)

    def exchange_pairs(self, x: np.ndarray) -> Iterable[tuple[int, int]]:
        x = _check_x(x, self.d)
        inside = [i for i in self.available if x[i]]
        outside = [j for j in self.available if not x[j]]
        return [(i, j) for i in inside for j in outside]


class PartitionMatroid:
    """Choose exactly ``caps[g]`` items from each group ``groups[g]`` (disjoint groups of items)."""

    def __init__(self, d: int, groups: Sequence[Sequence[int]], caps: Sequence[int]):
        groups = [sorted(set(int(i) for i in g)) for g in groups]
        flat = [i for g in groups for i in g]
        if not groups or len(flat) != len(set(flat)) or not all(0 <= i < d for i in flat):
            raise ValueError("groups must be non-empty, disjoint subsets of range(d)")
        if len(caps) != len(groups) or not all(1 <= c <= len(g) for c, g in zip(caps, groups, strict=True)):
            raise ValueError("caps must give each group a count in [1, len(group)]")
        self.d, self.groups, self.caps = d, groups, [int(c) for c in caps]

    def argmax(self, w: np.ndarray) -> np.ndarray:
        w = _check_w(w, self.d)
        x = np.zeros(self.d, dtype=np.int64)
        for g, c in zip(self.groups, self.caps, strict=True):
            x[_order(w, g)[:c]] = 1
        return x

    def argmin(self, w: np.ndarray) -> np.ndarray:
        return self.argmax(-_check_w(w, self.d))

    def contains(self, x: np.ndarray) -> bool:
        x = _check_x(x, self.d)
        grouped = {i for g in self.groups for i in g}
        if any(x[i] for i in range(self.d) if i not in grouped):
            return False
        return all(int(x[g].sum()) == c for g, c in zip(self.groups, self.caps, strict=True))

    def exchange_pairs(self, x: np.ndarray) -> Iterable[tuple[int, int]]:
        x = _check_x(x, self.d)
        return [(i, j) for g in self.groups for i in g if x[i] for j in g if not x[j]]


def _find(parent: list[int], a: int) -> int:
    """Union-find root of ``a`` with path halving (mutates ``parent``)."""
    while parent[a] != a:
        parent[a] = parent[parent[a]]
        a = parent[a]
    return a


class GraphicMatroid:
    """Choose a spanning forest of a graph; item ``e`` is edge ``edges[e]`` (items not in ``available`` excluded)."""

    def __init__(self, n_nodes: int, edges: Sequence[tuple[int, int]], available: Sequence[int] | None = None):
        self.n_nodes, self.edges = n_nodes, [tuple(map(int, e)) for e in edges]
        self.d = len(self.edges)
        if not all(0 <= u < n_nodes and 0 <= v < n_nodes and u != v for u, v in self.edges):
            raise ValueError("edges must join two different nodes in range(n_nodes)")
        self.available = sorted(range(self.d) if available is None else set(int(e) for e in available))
        if not self.available or not all(0 <= e < self.d for e in self.available):
            raise ValueError("available must be a non-empty subset of the edge indices")
        self.rank = self._forest_size(self.available)

    def _components(self, items: Iterable[int]) -> list[int]:
        parent = list(range(self.n_nodes))
        for e in items:
            u, v = self.edges[e]
            parent[_find(parent, u)] = _find(parent, v)
        return [_find(parent, a) for a in range(self.n_nodes)]

    def _forest_size(self, items: Iterable[int]) -> int:
        return self.n_nodes - len(set(self._components(items)))

    def argmax(self, w: np.ndarray) -> np.ndarray:
        """Kruskal: heaviest edges first, skipping those that close a cycle."""
        w = _check_w(w, self.d)
        parent = list(range(self.n_nodes))
        x = np.zeros(self.d, dtype=np.int64)
        for e in _order(w, self.available):
            ru, rv = _find(parent, self.edges[e][0]), _find(parent, self.edges[e][1])
            if ru != rv:
                parent[ru] = rv
                x[e] = 1
        return x

    def argmin(self, w: np.ndarray) -> np.ndarray:
        return self.argmax(-_check_w(w, self.d))

    def contains(self, x: np.ndarray) -> bool:
        x = _check_x(x, self.d)
        chosen = np.flatnonzero(x).tolist()
        if not set(chosen) <= set(self.available) or len(chosen) != self.rank:
            return False
        return self._forest_size(chosen) == len(chosen)  # acyclic with rank edges = a spanning forest

    def exchange_pairs(self, x: np.ndarray) -> Iterable[tuple[int, int]]:
        """(i, j): removing tree edge i splits a component that non-tree edge j reconnects."""
        x = _check_x(x, self.d)
        tree = [e for e in self.available if x[e]]
        pairs = []
        for i in tree:
            comp = self._components(e for e in tree if e != i)
            for j in self.available:
                if not x[j] and comp[self.edges[j][0]] != comp[self.edges[j][1]]:
                    pairs.append((i, j))
        return pairs
