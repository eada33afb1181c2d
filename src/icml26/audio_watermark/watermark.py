"""Cluster-level KGW: green lists over cluster ids, seeded by a keyed hash of the previous h cluster ids.

Generation: at each step the cluster ids of the previous h tokens seed a ``torch.Generator`` through a keyed hash
(a polynomial hash of the ids keyed by ``key``, mod 2^61 - 1, then an XOR mix); the first
``n_green = max(1, round(gamma * C))`` entries of a random permutation of the C clusters are green, and ``delta`` is
added to the logit of every token whose cluster is green. With the identity map (C = V) this is the token-level KGW
baseline. Several token streams (RVQ levels) get one green list each: stream s uses the key ``stream_key(key, s)``.

Detection, from tokens re-encoded from audio: map to clusters, count green tokens n_g among the n scored positions,
**summed over the streams**, and test with the exact green share ``gamma_eff = n_green / C`` (not the nominal
gamma: with C = 19 and gamma = 0.25 it is 5/19). De-duplication (``dedup``): ``"cluster"`` scores each (stream,
context, cluster) once; ``"context"`` each (stream, context, token) once (h = 0: each token value once, the official
code); ``"token"`` each token value once; ``"none"`` every position. The null (``null``):

- ``"exact"``: under a uniformly random key the green clusters of one (stream, context) group are a uniformly random
  ``n_green``-subset, independent across groups. With ``dedup="cluster"`` each distinct cluster of group j is scored
  once, so its green count is hypergeometric: ``p = P[sum_j Hyp(C, n_green, k_j) >= n_g]`` by convolution. With any
  other ``dedup`` (``"token"``: the paper's counting, each token value once per stream, green status from the token's
  cluster) cluster c of group j carries the weight w_jc = its scored units, and the null is the weighted random-subset
  sum ``sum_j sum_{c in S_j} w_jc`` (``weighted_subset_null_pmf``, a dynamic program). Exact for any token
  distribution and any partition (the binomial is not: tokens of one cluster share their green status, and the token
  distribution is not uniform over clusters).
- ``"binomial"``: ``p = P[Bin(n, gamma_eff) >= n_g]`` (``scipy.stats.binom``), the official test; calibrated only
  when the scored units are independent draws with green share gamma_eff (token-level KGW with h >= 1).
- ``"keys"``: a Monte Carlo null over ``n_keys`` random keys on the same tokens: ``p = (1 + #{z_k >= z}) / (1 +
  n_keys)``; valid for any ``dedup`` (the true key is exchangeable with random ones under H0), floored at
  ``1 / (1 + n_keys)``.

``z = (n_g - gamma_eff n) / sqrt(n gamma_eff (1 - gamma_eff))`` in every case. Fewer than ``min_scored`` scored
tokens: no p-value, said so.

Example:
    >>> import numpy as np, torch
    >>> wm = ClusteredKGW(np.arange(8) // 2, gamma=0.5, delta=2.0, context_width=0)
    >>> bias = wm.bias(torch.tensor([[1, 2]]), vocab=8)
    >>> int((bias > 0).sum()), sorted(set((bias[0] > 0).nonzero()[:, 0].div(2, rounding_mode="floor").tolist()))
    (4, [1, 3])
    >>> s = wm.score(np.array([0, 2, 4, 6, 1]), min_scored=1)     # 4 distinct clusters, 2 of them green
    >>> s["n_scored"], s["n_green"], s["p_value"]
    (4.0, 2.0, 1.0)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from scipy.special import comb
from scipy.stats import binom, hypergeom

_MOD = (1 << 61) - 1
DEDUPS = ("cluster", "context", "token", "none")
NULLS = ("exact", "binomial", "keys")


def keyed_seed(context: tuple[int, ...], key: int) -> int:
    """Deterministic, order-sensitive seed from cluster ids: a polynomial hash over (c + 1) keyed by ``key``
    (mod 2^61 - 1), then an XOR-multiply mix."""
    s = key % _MOD
    for c in context:
        s = (s * 1_000_003 + int(c) + 1) % _MOD
    s ^= s >> 29
    s = (s * 0xBF58476D1CE4E5B9) % _MOD
    return int(s ^ (s >> 31)) & 0x7FFFFFFFFFFFFFFF


def stream_key(key: int, stream: int) -> int:
    """The key of token stream ``stream`` (RVQ level): stream 0 uses ``key`` itself."""
    return int(key) if stream == 0 else keyed_seed((stream, 7919), int(key))


def exact_null_sf(n_green_clusters: int, C: int, group_sizes: Sequence[int], observed: int) -> float:
    """``P[sum_j Hyp(C, n_green_clusters, k_j) >= observed]``: the green count of distinct clusters scored in
    independent groups (contexts, streams) of sizes ``k_j`` under a uniformly random key, by convolution."""
    if any(int(k) > C for k in group_sizes):
        raise ValueError(f"a group scores more distinct clusters than there are (C = {C})")
    return _convolved_sf([(C, n_green_clusters, int(k)) for k in group_sizes if int(k) > 0], observed)


class ClusteredKGW:
    """The watermark (see the module docstring).

    Args:
        cluster_map: ``(V,)`` cluster id per token (the identity for token-level KGW), or a list of such maps, one
            per token stream (RVQ level).
        gamma: nominal green share of the clusters (the exact one is ``gamma_eff = n_green / C``).
        delta: logit bias of green tokens.
        context_width: h, previous tokens (of the same stream) whose clusters seed the green list.
        key: the secret key.
        hash: ``"keyed"`` (this module's keyed hash of all h context ids, ``n_green = max(1, round(gamma C))``) or
            ``"lefthash"`` (``transformers``' ``WatermarkLogitsProcessor`` seeding: seed ``key * c_{t-1}`` from the
            last context id only, ``n_green = int(gamma C)``; needs h >= 1 and one stream), for the oracle test.
    """

    def __init__(
        self,
        cluster_map: np.ndarray | Sequence[np.ndarray],
        *,
        gamma: float = 0.25,
        delta: float = 2.0,
        context_width: int = 0,
        key: int = 15485863,
        hash: str = "keyed",
    ):
        maps = list(cluster_map) if isinstance(cluster_map, list | tuple) else [cluster_map]
        if not maps:
            raise ValueError("cluster_map must not be an empty list")
        cmaps = []
        for cm in maps:
            cmap = np.asarray(cm)
            if (
                cmap.ndim != 1
                or cmap.size == 0
                or not np.issubdtype(cmap.dtype, np.integer)
                or cmap.min() < 0
            ):
                raise ValueError(
                    "cluster_map must be a non-empty 1-D integer array of non-negative cluster ids "
                    f"(got shape {cmap.shape}, dtype {cmap.dtype})"
                )
            cmaps.append(cmap)
        if len({len(c) for c in cmaps}) != 1:
            raise ValueError("cluster_map: every stream's map must cover the same vocabulary")
        if isinstance(key, bool) or not isinstance(key, int | np.integer):
            raise TypeError(f"key must be an integer, got {type(key).__name__}")
        if not 0 < gamma < 1 or delta < 0 or context_width < 0:
            raise ValueError("gamma must be in (0, 1), delta >= 0 and context_width >= 0")
        if hash not in ("keyed", "lefthash"):
            raise ValueError(f"hash must be 'keyed' or 'lefthash', got {hash!r}")
        if hash == "lefthash" and (context_width < 1 or len(cmaps) != 1):
            raise ValueError(
                "hash='lefthash' (the transformers seeding) needs context_width >= 1 and one stream"
            )
        self.hash = hash
        self.cmaps = [torch.as_tensor(c, dtype=torch.long) for c in cmaps]
        self.Cs = [int(c.max()) + 1 for c in cmaps]
        self.n_greens = [max(1, int(gamma * C) if hash == "lefthash" else round(gamma * C)) for C in self.Cs]
        self.cmap, self.C, self.n_green = self.cmaps[0], self.Cs[0], self.n_greens[0]
        self.gamma, self.delta, self.h, self.key = gamma, delta, context_width, int(key)
        self._cache: dict[tuple[int, int, tuple[int, ...]], np.ndarray] = {}
        self._gen = torch.Generator()

    @property
    def n_streams(self) -> int:
        return len(self.cmaps)

    @property
    def gamma_eff(self) -> float:
        """The exact green share n_green / C of stream 0 (what the test uses; ``gamma`` is nominal)."""
        return self.n_green / self.C

    @property
    def key_space(self) -> int:
        """C^h distinct green lists per stream (1 for h = 0)."""
        return self.C**self.h

    def green_clusters(
        self, context: tuple[int, ...], *, stream: int = 0, key: int | None = None
    ) -> torch.Tensor:
        """(C,) bool: the green clusters of ``stream`` for a context of h cluster ids (``key``: another key)."""
        return torch.from_numpy(self._green(context, stream, self.key if key is None else int(key)))

    def _green(self, context: tuple[int, ...], stream: int, key: int, cache: bool = True) -> np.ndarray:
        """(C,) bool numpy array of :meth:`green_clusters` (``cache=False``: not kept, for one-off null keys)."""
        k = stream_key(key, stream)
        ck = (k, stream, context)
        hit = self._cache.get(ck)
        if hit is not None:
            return hit
        if self.hash == "lefthash":  # transformers: hash_key * input_seq[-1]
            seed = (k * int(context[-1])) % (2**64 - 1)
        else:
            seed = keyed_seed(context, k)
        self._gen.manual_seed(seed)  # one reused generator: the same stream as a fresh one with this seed
        green = np.zeros(self.Cs[stream], dtype=bool)
        green[torch.randperm(self.Cs[stream], generator=self._gen)[: self.n_greens[stream]].numpy()] = True
        if cache:
            if len(self._cache) > 200_000:
                self._cache.clear()
            self._cache[ck] = green
        return green

    def bias(
        self,
        prev_tokens: torch.Tensor,
        vocab: int,
        offset: int = 0,
        *,
        stream: int = 0,
        keys: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """(B, vocab) additive logit bias given stream ``stream``'s codec tokens generated so far (B, L); the codec's
        token t sits at vocabulary index ``offset + t``; no bias before h tokens. ``keys``: one key per row (one key
        per generation), else ``self.key``."""
        B, L = prev_tokens.shape
        out = torch.zeros(B, vocab)
        if L < self.h:
            return out
        cmap = self.cmaps[stream]
        cm = cmap.numpy()
        ctxs = cm[prev_tokens[:, L - self.h :].numpy()] if self.h else np.zeros((B, 0), dtype=np.int64)
        rows = np.stack(
            [
                self._green(tuple(ctxs[b].tolist()), stream, self.key if keys is None else int(keys[b]))
                for b in range(B)
            ]
        )
        out[:, offset : offset + len(cm)] = self.delta * torch.from_numpy(rows[:, cm]).float()
        return out

    def logits_processor(
        self, prompt_len: int = 1, offset: int = 0, *, keys: Sequence[int] | None = None
    ) -> Any:
        """A ``transformers.LogitsProcessor``: the bias on generated tokens (after ``prompt_len``) of a model whose
        vocabulary holds the codec tokens at ``offset:``; ids below ``offset`` (special tokens) are banned.
        ``keys``: one key per batch row (one key per generation)."""
        from ..common.optional import requires

        requires("transformers", extra="hf", purpose="the watermark's LogitsProcessor")
        from transformers import LogitsProcessor

        wm = self

        class ClusteredKGWLogitsProcessor(LogitsProcessor):
            def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
                prev = input_ids[:, prompt_len:] - offset
                scores = scores + wm.bias(prev, scores.shape[-1], offset, keys=keys).to(scores.dtype)
                scores[:, :offset] = -float("inf")
                return scores

        return ClusteredKGWLogitsProcessor()

    def _check_tokens(self, tokens: Any) -> np.ndarray:
        raw = tokens.detach().cpu().numpy() if isinstance(tokens, torch.Tensor) else np.asarray(tokens)
        if raw.size and not np.issubdtype(raw.dtype, np.integer):
            raise TypeError(
                f"tokens must be integer token ids, got dtype {raw.dtype} (a float array would be "
                "truncated silently)"
            )
        t = raw.astype(np.int64)
        if t.ndim == 1:
            t = t[None]
        if t.ndim != 2 or t.shape[0] != self.n_streams:
            raise ValueError(
                f"tokens must be 1-D (one stream) or (n_streams={self.n_streams}, T), got shape {raw.shape}"
            )
        if t.size and (t.min() < 0 or t.max() >= len(self.cmap)):
            raise ValueError(f"tokens must be in [0, {len(self.cmap)})")
        return t

    def _units(self, t: np.ndarray, dedup: str) -> list[tuple[int, tuple[int, ...], int, int]]:
        """The scored units ``(stream, context, cluster, token)`` after de-duplication."""
        units = []
        for s in range(t.shape[0]):
            clusters = self.cmaps[s][torch.from_numpy(t[s])].numpy() if t.shape[1] else t[s]
            seen: set[Any] = set()
            for i in range(self.h, t.shape[1]):
                ctx = tuple(int(c) for c in clusters[i - self.h : i]) if self.h else ()
                item: Any = {
                    "cluster": (ctx, int(clusters[i])),
                    "context": (ctx, int(t[s, i])),
                    "token": int(t[s, i]),
                    "none": i,
                }[dedup]
                if item in seen:
                    continue
                seen.add(item)
                units.append((s, ctx, int(clusters[i]), int(t[s, i])))
        return units

    def _count(self, units: list[tuple[int, tuple[int, ...], int, int]], key: int, cache: bool = True) -> int:
        return sum(bool(self._green(ctx, s, key, cache)[c]) for s, ctx, c, _ in units)

    @staticmethod
    def _weights(
        units: list[tuple[int, tuple[int, ...], int, int]],
    ) -> dict[tuple[int, tuple[int, ...]], dict[int, int]]:
        """``{(stream, context): {cluster: scored units}}``: the groups that share one green list, and how many
        scored units each cluster of a group carries (all 1 with ``dedup="cluster"``)."""
        weights: dict[tuple[int, tuple[int, ...]], dict[int, int]] = {}
        for s, ctx, c, _ in units:
            w = weights.setdefault((s, ctx), {})
            w[c] = w.get(c, 0) + 1
        return weights

    def _weighted_pmf(self, weights: dict[tuple[int, tuple[int, ...]], dict[int, int]]) -> np.ndarray:
        """The pmf of the green units under a random key: the groups' weighted random-subset sums, convolved."""
        pmf = np.ones(1)
        for (s, _), w in weights.items():
            pmf = np.convolve(pmf, _weighted_pmf_cached(self.Cs[s], self.n_greens[s], tuple(sorted(w.values()))))
        return pmf

    def score(
        self,
        tokens: Any,
        *,
        min_scored: int = 16,
        dedup: str = "cluster",
        null: str = "exact",
        n_keys: int = 999,
        null_seed: int = 0,
    ) -> dict[str, float | bool | str]:
        """Detect from tokens (``(T,)`` or ``(n_streams, T)``; counts summed over streams): n_green, n_scored, z,
        the p-value under ``null`` and ``neglog10_p`` (none below ``min_scored`` scored tokens).

        Args:
            tokens: re-encoded codec tokens.
            min_scored: fewest scored units for a p-value.
            dedup: ``"cluster"`` | ``"context"`` | ``"token"`` | ``"none"`` (module docstring).
            null: ``"exact"`` (hypergeometric with ``dedup="cluster"``, the weighted random-subset sum otherwise) |
                ``"binomial"`` | ``"keys"``.
            n_keys: random keys of the ``"keys"`` null.
            null_seed: seed of those keys.

        Returns:
            ``{"n_green", "n_scored", "gamma_eff", "enough", "z", "p_value", "neglog10_p"}`` (or ``reason``).
        """
        if dedup not in DEDUPS:
            raise ValueError(f"dedup must be one of {DEDUPS}, got {dedup!r}")
        if null not in NULLS:
            raise ValueError(f"null must be one of {NULLS}, got {null!r}")
        if isinstance(n_keys, bool) or not isinstance(n_keys, int | np.integer) or n_keys < 1:
            raise ValueError(f"n_keys must be a positive integer, got {n_keys!r}")
        t = self._check_tokens(tokens)
        units = self._units(t, dedup)
        n, g = len(units), self._count(units, self.key)
        sizes = [self.Cs[s] for s, *_ in units]
        greens = [self.n_greens[s] for s, *_ in units]
        ge = float(np.mean(np.array(greens) / np.array(sizes))) if n else self.gamma_eff
        out: dict[str, float | bool | str] = {"n_green": float(g), "n_scored": float(n), "gamma_eff": ge}
        if n < min_scored:
            out.update(enough=False, reason=f"only {n} scored tokens (< {min_scored}): no reliable p-value")
            return out
        z = (g - ge * n) / np.sqrt(n * ge * (1 - ge))  # z with the exact green share
        if null == "binomial":
            p = float(binom.sf(g - 1, n, ge))  # P[Bin(n, gamma_eff) >= g]
        elif null == "exact" and dedup == "cluster":
            groups: dict[tuple[int, tuple[int, ...]], int] = {}
            for s, ctx, _, _ in units:
                groups[(s, ctx)] = groups.get((s, ctx), 0) + 1
            # p = P[sum_j Hyp(C_s, n_green_s, k_j) >= n_g] over groups j = (stream s, context)
            p = _convolved_sf([(self.Cs[s], self.n_greens[s], k) for (s, _), k in groups.items()], g)
        elif null == "exact":
            # p = P[sum_j sum_{c in S_j} w_jc >= n_g], S_j a uniformly random n_green-subset of the C_s clusters
            pmf = self._weighted_pmf(self._weights(units))
            p = float(min(1.0, max(0.0, pmf[max(0, g) :].sum())))
        else:
            rng = np.random.default_rng(null_seed)
            null_g = np.array(
                [self._count(units, int(k), cache=False) for k in rng.integers(1, 2**62, n_keys)]
            )
            p = float((1 + (null_g >= g).sum()) / (1 + n_keys))
        out.update(enough=True, z=float(z), p_value=p, neglog10_p=float(-np.log10(max(p, 1e-300))))
        return out

    def score_keys(
        self,
        tokens: Any,
        keys: Sequence[int],
        *,
        min_scored: int = 16,
        dedup: str = "cluster",
        null: str = "exact",
    ) -> list[dict[str, Any]]:
        """``score(tokens, min_scored=min_scored, dedup=dedup, null=null)`` under each of ``keys``, vectorised: the
        scored units and the null's pmf do not depend on the key, so they are computed once (an empirical null: one
        unwatermarked clip tested under many keys).

        Args:
            tokens: re-encoded codec tokens.
            keys: the keys to test under.
            min_scored: fewest scored units for a p-value.
            dedup: as in :meth:`score`.
            null: ``"exact"`` or ``"binomial"`` (the ``"keys"`` null is not vectorised).

        Returns:
            one dict per key, as :meth:`score` returns (``p_value`` equal to it).
        """
        if dedup not in DEDUPS:
            raise ValueError(f"dedup must be one of {DEDUPS}, got {dedup!r}")
        if null not in ("exact", "binomial"):
            raise ValueError(f"null must be 'exact' or 'binomial' in score_keys, got {null!r}")
        t = self._check_tokens(tokens)
        units = self._units(t, dedup)
        n = len(units)
        ge = float(np.mean([self.n_greens[s] / self.Cs[s] for s, *_ in units])) if n else self.gamma_eff
        if n < min_scored:
            reason = f"only {n} scored tokens (< {min_scored}): no reliable p-value"
            return [
                {"n_green": float(self._count(units, int(k))), "n_scored": float(n), "gamma_eff": ge,
                 "enough": False, "reason": reason}
                for k in keys
            ]  # fmt: skip
        weights = self._weights(units)
        if null == "binomial":
            tail = None
        elif dedup == "cluster":
            # p = P[sum_j Hyp(C_s, n_green_s, k_j) >= n_g]: one pmf for every key; tail sums by a reversed cumsum
            tail = np.cumsum(_convolved_pmf([(self.Cs[s], self.n_greens[s], len(w)) for (s, _), w in weights.items()])
                             [::-1])[::-1]  # fmt: skip
        else:
            # p = P[sum_j sum_{c in S_j} w_jc >= n_g]: the weighted random-subset sum, one pmf for every key
            tail = np.cumsum(self._weighted_pmf(weights)[::-1])[::-1]
        members = [
            (s, ctx, np.array(list(w)), np.array(list(w.values()))) for (s, ctx), w in weights.items()
        ]
        out = []
        for key in keys:
            cache = int(key) == self.key  # one-off null keys are not cached
            g = int(sum((self._green(ctx, s, int(key), cache)[cs] * ws).sum() for s, ctx, cs, ws in members))
            if tail is None:
                p = float(binom.sf(g - 1, n, ge))  # P[Bin(n, gamma_eff) >= g]
            else:
                p = float(min(1.0, max(0.0, tail[g]))) if g < len(tail) else 0.0
            z = (g - ge * n) / np.sqrt(n * ge * (1 - ge))
            out.append(
                {"n_green": float(g), "n_scored": float(n), "gamma_eff": ge, "enough": True, "z": float(z),
                 "p_value": p, "neglog10_p": float(-np.log10(max(p, 1e-300)))}
            )  # fmt: skip
        return out


def weighted_subset_null_pmf(C: int, G: int, weights: Sequence[int]) -> np.ndarray:
    """The pmf of the green units of one (stream, context) group under a uniformly random key.

    The key makes the group's green clusters a uniformly random G-subset S of the C clusters; the group scores w_c
    units of each of its k present clusters c (the paper's counting: each token value once, green status from its
    cluster, so w_c is how many distinct tokens of cluster c were scored). The green count is the weighted
    random-subset sum

        X = sum_{c in S} w_c,   P[X = x] = sum_j N_j(x) * binom(C - k, G - j) / binom(C, G),

    where N_j(x) counts the j-subsets of the k present clusters with weight sum x (a knapsack-style dynamic program
    over the clusters) and binom(C - k, G - j) / binom(C, G) is the chance that S meets the present clusters in one
    given j-subset. With unit weights X is Hyp(C, G, k).

    Args:
        C: clusters of the stream (>= 1).
        G: green clusters per list (1 <= G <= C).
        weights: positive scored-unit counts of the group's present clusters (k <= C of them).

    Returns:
        ``(sum(weights) + 1,)`` float64 pmf of X.

    Example:
        >>> weighted_subset_null_pmf(4, 2, [2, 1]) * 6  # subsets {a,b}: 3, {a,.}: 2 twice, {b,.}: 1 twice, {.,.}: 0
        array([1., 2., 2., 1.])

    Reference: Kirchenbauer et al., "A Watermark for Large Language Models", ICML 2023 (the green-list count);
    the null is this project's (issue 52).
    """
    w = [int(v) for v in weights]
    if isinstance(C, bool) or int(C) < 1 or not 1 <= int(G) <= int(C):
        raise ValueError(f"C must be >= 1 and G in [1, C], got C = {C}, G = {G}")
    if any(v < 1 for v in w) or len(w) > C:
        raise ValueError(f"weights must be positive and at most C = {C} of them, got {w}")
    k, J, W = len(w), min(len(w), int(G)), sum(w)
    N = np.zeros((J + 1, W + 1))  # N[j, x]: j-subsets of the present clusters with weight sum x
    N[0, 0] = 1.0
    for v in w:
        N[1:, v:] += N[:-1, : W + 1 - v].copy()
    # P[S meets the present clusters in one given j-subset] = binom(C - k, G - j) / binom(C, G)
    ways = np.array([comb(C - k, G - j) for j in range(J + 1)]) / comb(C, G)
    return ways @ N


@functools.lru_cache(maxsize=8192)
def _weighted_pmf_cached(C: int, G: int, weights: tuple[int, ...]) -> np.ndarray:
    return weighted_subset_null_pmf(C, G, weights)


@functools.lru_cache(maxsize=4096)
def _hyp_pmf(C: int, G: int, k: int) -> np.ndarray:
    """pmf of Hyp(C, G, k) on 0..min(k, G): green clusters among k distinct clusters of C, G of them green."""
    return hypergeom.pmf(np.arange(0, min(k, G) + 1), C, G, k)


def _convolved_pmf(groups: list[tuple[int, int, int]]) -> np.ndarray:
    """The pmf of ``sum_j Hyp(C_j, G_j, k_j)`` for groups ``(C_j, G_j, k_j)``."""
    pmf = np.ones(1)
    for C, G, k in groups:
        pmf = np.convolve(pmf, _hyp_pmf(C, G, k))
    return pmf


def _convolved_sf(groups: list[tuple[int, int, int]], observed: int) -> float:
    """``P[sum_j Hyp(C_j, G_j, k_j) >= observed]`` for groups ``(C_j, G_j, k_j)``."""
    return float(min(1.0, max(0.0, _convolved_pmf(groups)[max(0, int(observed)) :].sum())))
