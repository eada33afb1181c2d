"""Cluster-level KGW: green lists over cluster ids, seeded by a keyed hash of the previous h cluster ids.

Generation: at each step the cluster ids of the previous h tokens seed a ``torch.Generator`` through a keyed hash
(a polynomial hash of the ids keyed by ``key``, mod 2^61 - 1, then an XOR mix); the first ``round(gamma * C)`` entries of a random
permutation of the C clusters are green, and ``delta`` is added to the logit of every token whose cluster is green.
With the identity map (C = V) this is the token-level KGW baseline. Detection, from tokens re-encoded from audio:
map to clusters, count green tokens n_g among the n scored positions (a position is scored once per distinct
token value, as in the official code), and test one-sided ``p = P[Bin(n, gamma) >= n_g]`` (``scipy.stats.binom``),
``z = (n_g - gamma n) / sqrt(n gamma (1 - gamma))``. Fewer than ``min_scored`` scored tokens: no p-value, said so.

Example:
    >>> import numpy as np, torch
    >>> wm = ClusteredKGW(np.arange(8) // 2, gamma=0.5, delta=2.0, context_width=0)
    >>> bias = wm.bias(torch.tensor([[1, 2]]), vocab=8)
    >>> int((bias > 0).sum()), sorted(set((bias[0] > 0).nonzero()[:, 0].div(2, rounding_mode="floor").tolist()))
    (4, [1, 3])
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from scipy.stats import binom

_MOD = (1 << 61) - 1


def keyed_seed(context: tuple[int, ...], key: int) -> int:
    """Deterministic, order-sensitive seed from cluster ids: a polynomial hash over (c + 1) keyed by ``key``
    (mod 2^61 - 1), then an XOR-multiply mix."""
    s = key % _MOD
    for c in context:
        s = (s * 1_000_003 + int(c) + 1) % _MOD
    s ^= s >> 29
    s = (s * 0xBF58476D1CE4E5B9) % _MOD
    return int(s ^ (s >> 31)) & 0x7FFFFFFFFFFFFFFF


class ClusteredKGW:
    """The watermark (see the module docstring).

    Args:
        cluster_map: ``(V,)`` cluster id per token (the identity for token-level KGW).
        gamma: green share of the clusters.
        delta: logit bias of green tokens.
        context_width: h, previous tokens whose clusters seed the green list.
        key: the secret key.
    """

    def __init__(self, cluster_map: np.ndarray, *, gamma: float = 0.25, delta: float = 2.0, context_width: int = 0,
                 key: int = 15485863):
        cmap = np.asarray(cluster_map)
        if cmap.ndim != 1 or cmap.size == 0 or not np.issubdtype(cmap.dtype, np.integer) or cmap.min() < 0:
            raise ValueError("cluster_map must be a non-empty 1-D integer array of non-negative cluster ids "
                             f"(got shape {cmap.shape}, dtype {cmap.dtype})")
        if isinstance(key, bool) or not isinstance(key, int | np.integer):
            raise TypeError(f"key must be an integer, got {type(key).__name__}")
        if not 0 < gamma < 1 or delta < 0 or context_width < 0:
            raise ValueError("gamma must be in (0, 1), delta >= 0 and context_width >= 0")
        self.cmap = torch.as_tensor(cmap, dtype=torch.long)
        self.C = int(cmap.max()) + 1
        self.gamma, self.delta, self.h, self.key = gamma, delta, context_width, key
        self.n_green = max(1, round(gamma * self.C))
        self._cache: dict[tuple[int, ...], torch.Tensor] = {}

    @property
    def key_space(self) -> int:
        """C^h distinct green lists (1 for h = 0)."""
        return self.C ** self.h

    def green_clusters(self, context: tuple[int, ...]) -> torch.Tensor:
        """(C,) bool: the green clusters for a context of h cluster ids."""
        if context not in self._cache:
            g = torch.Generator().manual_seed(keyed_seed(context, self.key))
            green = torch.zeros(self.C, dtype=torch.bool)
            green[torch.randperm(self.C, generator=g)[: self.n_green]] = True
            self._cache[context] = green
        return self._cache[context]

    def bias(self, prev_tokens: torch.Tensor, vocab: int, offset: int = 0) -> torch.Tensor:
        """(B, vocab) additive logit bias given the codec tokens generated so far (B, L); the codec's token t sits at
        vocabulary index ``offset + t``; no bias before h tokens."""
        B, L = prev_tokens.shape
        out = torch.zeros(B, vocab)
        if L < self.h:
            return out
        V = len(self.cmap)
        for b in range(B):
            ctx = tuple(int(c) for c in self.cmap[prev_tokens[b, L - self.h:]]) if self.h else ()
            out[b, offset:offset + V] = self.delta * self.green_clusters(ctx)[self.cmap].float()
        return out

    def logits_processor(self, prompt_len: int = 1, offset: int = 0) -> Any:
        """A ``transformers.LogitsProcessor``: the bias on generated tokens (after ``prompt_len``) of a model whose
        vocabulary holds the codec tokens at ``offset:``; ids below ``offset`` (special tokens) are banned."""
        from ..common.optional import requires

        requires("transformers", extra="hf", purpose="the watermark's LogitsProcessor")
        from transformers import LogitsProcessor

        wm = self

        class ClusteredKGWLogitsProcessor(LogitsProcessor):
            def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
                prev = input_ids[:, prompt_len:] - offset
                scores = scores + wm.bias(prev, scores.shape[-1], offset).to(scores.dtype)
                scores[:, :offset] = -float("inf")
                return scores

        return ClusteredKGWLogitsProcessor()

    def score(self, tokens: np.ndarray, *, min_scored: int = 16, dedup: str = "context"
              ) -> dict[str, float | bool | str]:
        """Detect from tokens: n_green, n_scored, z and the binomial p-value (none below ``min_scored``).

        ``dedup``: ``"context"`` scores each (h context clusters, token) pair once (for h = 0, each token value
        once, as in the official code); ``"token"`` each token value once; ``"none"`` every position (repeats
        make the binomial test anti-conservative: check the calibration on unwatermarked audio).
        """
        if dedup not in ("context", "token", "none"):
            raise ValueError(f"dedup must be 'context', 'token' or 'none', got {dedup!r}")
        raw = tokens.detach().cpu().numpy() if isinstance(tokens, torch.Tensor) else np.asarray(tokens)
        if raw.size and not np.issubdtype(raw.dtype, np.integer):
            raise TypeError(f"tokens must be integer token ids, got dtype {raw.dtype} (a float array would be "
                            "truncated silently)")
        t = raw.astype(np.int64)
        if t.ndim != 1:
            raise ValueError(f"tokens must be 1-D, got shape {t.shape}")
        if len(t) and (t.min() < 0 or t.max() >= len(self.cmap)):
            raise ValueError(f"tokens must be in [0, {len(self.cmap)})")
        clusters = self.cmap[torch.from_numpy(t)].numpy() if len(t) else t
        seen: set[Any] = set()
        n = g = 0
        for i in range(self.h, len(t)):
            ctx = tuple(int(c) for c in clusters[i - self.h:i]) if self.h else ()
            item = (ctx, int(t[i])) if dedup == "context" else int(t[i])
            if dedup != "none":
                if item in seen:
                    continue
                seen.add(item)
            n += 1
            g += bool(self.green_clusters(ctx)[clusters[i]])
        out: dict[str, float | bool | str] = {"n_green": float(g), "n_scored": float(n)}
        if n < min_scored:
            out.update(enough=False, reason=f"only {n} scored tokens (< {min_scored}): no reliable p-value")
            return out
        z = (g - self.gamma * n) / np.sqrt(n * self.gamma * (1 - self.gamma))
        p = float(binom.sf(g - 1, n, self.gamma))             # P[Bin(n, gamma) >= g]
        out.update(enough=True, z=float(z), p_value=p, neglog10_p=float(-np.log10(max(p, 1e-300))))
        return out
