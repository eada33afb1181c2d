"""Brute-force and closed-form oracles for the M-convex inverse learner (tests only; no experiment imports this).

- ``brute_centroid``: the centroid of the order polytope K = {w in [0, 1]^d : w_i >= w_j for (i, j) in E} by
  enumerating all d! permutations, against ``learner.exact_centroid``'s dynamic programme over down-sets. A uniform
  point of K is a uniform linear extension with the k-th smallest coordinate distributed as the k-th order
  statistic of d uniforms (mean k / (d + 1)), so

      centroid_i = E[position of i in a uniform random linear extension] / (d + 1)

- ``brute_bases``: every 0/1 point of a feasible set, by enumerating {0, 1}^d (for argmax / argmin and the
  exchange-pair optimality condition against greedy).
- ``volume_bound``: the mistake bound of the volume argument, each mistake cutting vol(K) by Grünbaum's factor
  (1 - 1/e) from 1 down to no less than 1/d!:

      #mistakes <= ln(d!) / ln(e / (e - 1))

Reference: Oki & Sakaue 2026, arXiv:2602.01682 (the O(d log d) bound; the learner is reconstructed, see the README).

Example:
    >>> brute_centroid(2, [(1, 0)]).tolist()
    [0.3333333333333333, 0.6666666666666666]
"""

from __future__ import annotations

import itertools
import math

import numpy as np


def brute_centroid(d: int, edges: list[tuple[int, int]]) -> np.ndarray:
    """Average position (1 = lowest) over all permutations consistent with i > j for (i, j) in edges, over d + 1.

    $$\\hat w_i = \\frac{1}{d + 1}\\, \\mathbb{E}_{\\sigma \\sim U(\\mathcal{L}(E))}[\\sigma(i)]$$
    with L(E) the linear extensions of the order E (the order polytope's centroid).
    """
    total, count = np.zeros(d), 0
    for perm in itertools.permutations(range(d)):  # perm[k] sits at position k + 1
        pos = {a: k + 1 for k, a in enumerate(perm)}
        if all(pos[i] > pos[j] for i, j in edges):
            total += [pos[a] for a in range(d)]
            count += 1
    return total / count / (d + 1)


def brute_bases(action_set, d: int) -> list[np.ndarray]:
    """Every x in {0, 1}^d that ``action_set.contains``: the feasible set listed in full.

    $$X = \\{x \\in \\{0, 1\\}^d : x \\in X\\}$$ (matroid bases as 0/1 vectors), for brute-force argmax / argmin.
    """
    return [np.array(x) for x in itertools.product((0, 1), repeat=d) if action_set.contains(np.array(x))]


def volume_bound(d: int) -> float:
    """The volume argument's mistake bound, by hand.

    $$\\#\\text{mistakes} \\le \\ln(d!) / \\ln\\frac{e}{e - 1}$$   (Grünbaum: each mistake keeps at most 1 - 1/e of
    the volume, which starts at 1 and stays at least 1/d!; the paper's O(d log d)).
    """
    return math.log(math.factorial(d)) / math.log(math.e / (math.e - 1))
