"""The finite-regret online learner for inverse linear optimisation on M-convex sets.

Setting (Oki & Sakaue 2026): in round t an agent with an unknown objective w* picks x_t = argmax_{x in X_t}
<w*, x> over an M-convex set X_t; the learner predicts x^_t from X_t first and then sees x_t. Regret is
sum_t <w*, x_t - x^_t>.

The learner (the design's reconstruction from the paper's structural characterisation):

- **feedback as order constraints**: on M-convex sets x_t is optimal iff w_i >= w_j for every exchange pair
  (i, j) of x_t, so each observation adds edges i > j to a poset on the d coordinates;
- **knowledge set**: K_t = {w in [0, 1]^d : w_i >= w_j for every edge}, the order polytope (optimality is
  invariant to adding a constant to w, so the cube loses nothing); vol(K_t) = #linear extensions / d!;
- **prediction** by the centroid of K_t, whose coordinate i is E[position of i in a uniformly random linear
  extension] / (d + 1), computed exactly by dynamic programming over the poset's down-sets (d <= 16) or by an
  adjacent-transposition Markov chain above that;
- **update only on mistakes**: a mistake exposes an edge that cuts through the centroid, so by Grünbaum's
  theorem vol(K_{t+1}) <= (1 - 1/e) vol(K_t); the volume starts at 1 and stays >= 1/d!, hence
  #mistakes <= ln(d!) / ln(e/(e - 1)) ~= 2.18 ln(d!) = O(d log d), and the regret is bounded independently of T;
- **corruption-robust variants**: true edges never form a cycle (w* has no ties), so a cycle proves that one of the
  rounds whose edges form it was corrupted. ``on_cycle="restart"`` discards every edge and restarts (the paper's
  O((C + 1) d log d) argument: at most C + 1 epochs); ``on_cycle="drop_cycle"`` discards only the rounds whose edges
  form the cycle (the current one included) and rebuilds the order from the others. Each drop removes at least
  one corrupted round, which never returns, so there are at most C drops; between drops every mistake (corrupted
  or not: x_obs is not the greedy choice under w^, so one of its edges cuts through the centroid) still shrinks the
  non-empty order polytope by Grünbaum's factor from a volume of at most 1 to at least 1/d!, so drop-cycle keeps
  the same (C + 1) (ln(d!) / ln(e/(e-1)) + 1) mistake bound while keeping the honest rounds outside the cycle.

Example:
    >>> import numpy as np
    >>> from icml26.inverse_optimization import MConvexInverseLearner, UniformMatroid
    >>> w_star = np.array([0.1, 0.9, 0.5, 0.3])
    >>> learner = MConvexInverseLearner(d=4)
    >>> for t in range(20):
    ...     X = UniformMatroid(d=4, available=[(t + i) % 4 for i in range(3)], k=1)
    ...     learner.update(X, X.argmax(w_star))  # doctest: +ELLIPSIS
    <...>
    >>> learner.n_mistakes_ <= mistake_bound(4)
    True

Reference: T. Oki, S. Sakaue, "Finite and Corruption-Robust Regret Bounds in Online Inverse Linear Optimization
under M-Convex Action Sets", ICML 2026, arXiv:2602.01682.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from .action_sets import ActionSet

#: 1 / ln(e / (e - 1)): Grünbaum's volume factor turned into a mistake count per nat of ln(d!)
GRUNBAUM_FACTOR = 1.0 / math.log(math.e / (math.e - 1.0))


def mistake_bound(d: int) -> float:
    """The volume argument's bound on mistakes: ln(d!) / ln(e / (e - 1)) ~= 2.18 ln(d!)."""
    # $$\#\text{mistakes} \le \frac{\ln d!}{\ln(e/(e-1))}$$
    return math.lgamma(d + 1) * GRUNBAUM_FACTOR


class Poset:
    """A strict partial order on range(d) kept transitively closed: ``below[i]`` is a bitmask of j with i > j."""

    def __init__(self, d: int):
        self.d = d
        self.below = [0] * d

    def copy(self) -> Poset:
        p = Poset(self.d)
        p.below = list(self.below)
        return p

    def implies(self, i: int, j: int) -> bool:
        return bool(self.below[i] >> j & 1)

    def contradicts(self, i: int, j: int) -> bool:
        """Whether adding i > j would close a cycle (j > i is already implied, or i == j)."""
        return i == j or self.implies(j, i)

    def add(self, i: int, j: int) -> bool:
        """Add i > j (and everything it implies); return whether the order changed."""
        if self.implies(i, j):
            return False
        new = (1 << j) | self.below[j]
        for a in range(self.d):
            if a == i or self.below[a] >> i & 1:
                self.below[a] |= new
        return True

    def edges(self) -> list[tuple[int, int]]:
        return [(i, j) for i in range(self.d) for j in range(self.d) if self.below[i] >> j & 1]


def exact_centroid(poset: Poset) -> np.ndarray:
    """Centroid of the order polytope: E[position in a uniform linear extension] / (d + 1), exactly.

    Dynamic programming over down-sets D (the |D| lowest elements): f(D) counts the orderings of D, g(D) the
    completions above it, and element a placed right above D at position |D| + 1 contributes f(D) g(D + a).
    Counts are Python integers (linear-extension counts overflow int64 from d = 21).
    """
    d = poset.d
    full = (1 << d) - 1
    below = poset.below
    levels: list[dict[int, int]] = [{0: 1}]  # f over down-sets, level = size
    for _ in range(d):
        nxt: dict[int, int] = {}
        for D, count in levels[-1].items():
            free = full & ~D
            while free:
                bit = free & -free
                free ^= bit
                a = bit.bit_length() - 1
                if below[a] & ~D == 0:  # everything below a is already placed
                    nxt[D | bit] = nxt.get(D | bit, 0) + count
        levels.append(nxt)
    g: dict[int, int] = {full: 1}
    position_sum = [0] * d
    for size in range(d - 1, -1, -1):
        for D, count in levels[size].items():
            total = 0
            free = full & ~D
            while free:
                bit = free & -free
                free ^= bit
                a = bit.bit_length() - 1
                if below[a] & ~D == 0:
                    completions = g[D | bit]
                    total += completions
                    position_sum[a] += count * completions * (size + 1)
            g[D] = total
    n_extensions = g[0]
    # $$\hat w_i = \frac{\mathbb{E}[\mathrm{pos}_i]}{d+1}$$
    return np.array([s / n_extensions / (d + 1) for s in position_sum], dtype=np.float64)


def linear_extension(poset: Poset) -> list[int]:
    """One linear extension, lowest first (Kahn's algorithm, ties by index): a consistent order."""
    placed, order = 0, []
    while len(order) < poset.d:
        a = next(a for a in range(poset.d) if not placed >> a & 1 and poset.below[a] & ~placed == 0)
        order.append(a)
        placed |= 1 << a
    return order


def mcmc_centroid(poset: Poset, n_samples: int, rng: np.random.Generator, burn_in: int | None = None) -> np.ndarray:
    """Centroid estimated with the adjacent-transposition chain on linear extensions (Karzanov-Khachiyan).

    The lazy chain proposes swapping two neighbours in the current order and accepts when they are
    incomparable; it mixes in O(d^3 log d) steps. ``n_samples`` states are averaged, ``d`` steps apart, after
    ``burn_in`` steps (default 10 d^2).
    """
    d = poset.d
    order = linear_extension(poset)
    if d == 1:
        return np.array([0.5])
    burn_in = 10 * d * d if burn_in is None else burn_in
    steps = burn_in + n_samples * d
    ks = rng.integers(0, d - 1, size=steps)
    coins = rng.random(steps)
    total = np.zeros(d)
    positions = np.empty(d)
    for step in range(steps):
        k = ks[step]
        lo, hi = order[k], order[k + 1]
        if coins[step] < 0.5 and not poset.implies(hi, lo):  # lazy; swap incomparable neighbours only
            order[k], order[k + 1] = hi, lo
        if step >= burn_in and (step - burn_in) % d == d - 1:
            positions[order] = np.arange(1, d + 1)
            total += positions
    return total / n_samples / (d + 1)


ON_CYCLE = ("restart", "drop_cycle", "ignore")


class MConvexInverseLearner:
    """Online inverse linear optimisation on M-convex sets with regret bounded independently of T.

    Args:
        d: dimension of the unknown objective w*.
        centroid: ``"exact"`` (DP, exact up to ``max_exact_d``, then MCMC), ``"mcmc"``, or ``"consistent"``
            (any point of the knowledge set: the heights of one linear extension; the ablation without the
            centroid's guarantee).
        robust: shorthand kept for older code: ``True`` is ``on_cycle="restart"``, ``False`` is
            ``on_cycle="ignore"`` (used only when ``on_cycle`` is not given).
        on_cycle: what a contradictory observation (a cycle) does: ``"restart"`` discards every constraint,
            ``"drop_cycle"`` discards the rounds whose constraints form the cycle (the current one included),
            ``"ignore"`` skips the contradicting constraints (the non-robust variant).
        max_exact_d: largest d for the exact DP when ``centroid="exact"``.
        n_samples: MCMC samples.
        random_state: seed of the MCMC chain.

    Attributes:
        w_hat_: the current point estimate; n_mistakes_, n_restarts_ (restarts or drops), n_dropped_rounds_,
        n_rounds_; poset_ (the order constraints).
    """

    def __init__(self, d: int, centroid: str = "exact", robust: bool = True, max_exact_d: int = 16,
                 n_samples: int = 2000, random_state: int | None = None, on_cycle: str | None = None):
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
            raise ValueError(f"d must be a positive int, got {d!r}")
        if centroid not in ("exact", "mcmc", "consistent"):
            raise ValueError(f"centroid must be 'exact', 'mcmc' or 'consistent', got {centroid!r}")
        if on_cycle is None:
            on_cycle = "restart" if robust else "ignore"
        if on_cycle not in ON_CYCLE:
            raise ValueError(f"on_cycle must be one of {ON_CYCLE}, got {on_cycle!r}")
        self.d, self.centroid, self.on_cycle = int(d), centroid, on_cycle
        self.robust = on_cycle != "ignore"
        self.max_exact_d, self.n_samples = max_exact_d, n_samples
        self._rng = np.random.default_rng(random_state)
        self.poset_ = Poset(self.d)
        self._kept: dict[int, list[tuple[int, int]]] = {}    # mistake round -> its edges (drop_cycle)
        self.n_mistakes_ = self.n_restarts_ = self.n_rounds_ = self.n_dropped_rounds_ = 0
        self._last: tuple[ActionSet, np.ndarray] | None = None     # the last (set, prediction), until w_hat moves
        self.w_hat_ = self._estimate()

    def _estimate(self) -> np.ndarray:
        if self.centroid == "consistent":
            heights = np.empty(self.d)
            heights[linear_extension(self.poset_)] = np.arange(1, self.d + 1)
            return heights / (self.d + 1)
        if self.centroid == "exact" and self.d <= self.max_exact_d:
            return exact_centroid(self.poset_)
        return mcmc_centroid(self.poset_, self.n_samples, self._rng)

    def _check(self, action_set: ActionSet) -> None:
        if getattr(action_set, "d", None) != self.d:
            raise ValueError(f"the feasible set has dimension {getattr(action_set, 'd', None)}, the learner {self.d}")

    def predict(self, action_set: ActionSet) -> np.ndarray:
        """The recommended action: argmax over the feasible set of <w_hat, x> (greedy)."""
        self._check(action_set)
        if self._last is not None and self._last[0] is action_set:
            return self._last[1].copy()      # same set, same w_hat: update() reuses the prediction it follows
        guess = action_set.argmax(self.w_hat_)
        self._last = (action_set, guess)
        return guess.copy()

    def update(self, action_set: ActionSet, x_obs: np.ndarray) -> MConvexInverseLearner:
        """Learn from the agent's optimal action ``x_obs`` on ``action_set`` (only a mistake changes anything)."""
        self._check(action_set)
        if not action_set.contains(x_obs):
            raise ValueError("the observed action is not in the feasible set")
        self.n_rounds_ += 1
        x_obs = np.asarray(x_obs)
        if np.array_equal(self.predict(action_set), x_obs):
            return self
        self.n_mistakes_ += 1
        before = list(self.poset_.below)
        self._add_edges(action_set.exchange_pairs(x_obs))
        if self.poset_.below != before or self.centroid == "mcmc":
            self.w_hat_ = self._estimate()      # an unchanged order keeps its (exact) centroid
            self._last = None
        return self

    def _add_edges(self, edges: Iterable[tuple[int, int]]) -> None:
        trial = self.poset_.copy()
        mine: list[tuple[int, int]] = []
        for i, j in edges:
            if trial.contradicts(i, j):
                if self.on_cycle == "restart":
                    # a cycle proves a corrupted observation in this epoch: discard everything, restart
                    self.poset_ = Poset(self.d)
                    self._kept = {}
                    self.n_restarts_ += 1
                    return
                if self.on_cycle == "drop_cycle":
                    # a cycle proves that one of the rounds forming it was corrupted: drop those rounds only
                    self._drop(self._cycle_rounds(i, j, mine))
                    return
                continue  # non-robust: ignore the contradicting constraint
            trial.add(i, j)
            mine.append((i, j))
        self.poset_ = trial
        if self.on_cycle == "drop_cycle" and mine:
            self._kept[self.n_rounds_] = mine

    def _cycle_rounds(self, i: int, j: int, mine: list[tuple[int, int]]) -> set[int]:
        """Rounds whose edges, with the new edge i > j, close a cycle: a shortest path j > ... > i (BFS, edges
        in round order) through the kept rounds' edges and the current round's edges added so far."""
        adj: dict[int, list[tuple[int, int]]] = {}
        for r, es in [*sorted(self._kept.items()), (self.n_rounds_, mine)]:
            for a, b in es:
                adj.setdefault(a, []).append((b, r))
        parent: dict[int, tuple[int, int]] = {}
        frontier, seen = [j], {j}
        while frontier and i not in seen:
            nxt = []
            for a in frontier:
                for b, r in adj.get(a, []):
                    if b not in seen:
                        seen.add(b)
                        parent[b] = (a, r)
                        nxt.append(b)
            frontier = nxt
        if i not in seen:                    # cannot happen: the poset is the closure of these edges
            raise RuntimeError("contradiction without a path in the kept constraints")
        rounds, node = {self.n_rounds_}, i
        while node != j:
            node, r = parent[node]
            rounds.add(r)
        return rounds

    def _drop(self, rounds: set[int]) -> None:
        for r in rounds:
            self._kept.pop(r, None)
        self.poset_ = Poset(self.d)
        for es in self._kept.values():
            for a, b in es:
                self.poset_.add(a, b)
        self.n_restarts_ += 1
        self.n_dropped_rounds_ += len(rounds)
