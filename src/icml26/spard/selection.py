"""Safety-data selection: the relevance-diversity DPP selector, its random baseline, and the model's embeddings.

``RelevanceDiversityDPPSelector(beta=4, ratio=0.03).fit(reference_embs).select(candidate_embs)`` returns the
indices of ``k = floor(ratio * len(reference))`` safety candidates (or an explicit ``k``), in the order the
greedy MAP picked them. Embeddings come from the fine-tuned model itself: :func:`mean_last_hidden` mean-pools the
last-layer hidden states over the prompt tokens, as the released code does with the base LLM.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> reference = rng.normal(size=(100, 8)); candidates = rng.normal(size=(40, 8))
    >>> sel = RelevanceDiversityDPPSelector(beta=4.0, ratio=0.03).fit(reference)
    >>> idx = sel.select(candidates)
    >>> len(idx), len(set(idx.tolist())), sel.k_
    (3, 3, 3)
    >>> RandomSelector(ratio=0.03, seed=0).fit(reference).select(candidates).shape
    (3,)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .core import _as_matrix, greedy_dpp_map, relevance_diversity_kernel


def _budget(ratio: float | None, k: int | None, n_reference: int) -> int:
    if k is not None:
        return k
    assert ratio is not None
    # k = floor(p * |D_ft|)   (official: int(len(ref_dataset) * safe_sample_ratio))
    return math.floor(ratio * n_reference + 1e-9)


def _check_budget_args(ratio: float | None, k: int | None) -> None:
    if k is None and ratio is None:
        raise ValueError("give the budget as ratio (a fraction of the fine-tuning set) or k")
    if k is not None:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise TypeError(f"k must be an int, got {type(k).__name__}")
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
    elif isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1 \
            or not math.isfinite(ratio):
        raise ValueError(f"ratio must be in (0, 1], got {ratio!r}")


class _Selector:
    """Shared budget logic: ``fit`` on the fine-tuning data's embeddings, ``select`` from candidates."""

    def __init__(self, ratio: float | None = 0.03, k: int | None = None):
        self.ratio = ratio
        self.k = k

    def fit(self, reference_embs: Any) -> _Selector:
        """Remember the fine-tuning (reference) data and fix the budget ``k_``.

        Raises:
            ValueError: bad budget settings, a budget of zero items, or bad embeddings.
        """
        _check_budget_args(self.ratio, self.k)
        self.reference_ = _as_matrix(reference_embs, "reference_embs")
        self.k_ = _budget(self.ratio, self.k, len(self.reference_))
        if self.k_ < 1:
            raise ValueError(f"ratio {self.ratio} of {len(self.reference_)} reference items selects nothing "
                             "(floor(ratio * n) = 0); raise ratio or give k")
        return self

    def _candidates(self, candidate_embs: Any) -> np.ndarray:
        if not hasattr(self, "reference_"):
            raise RuntimeError(f"{type(self).__name__} is not fitted: call fit(reference_embs) first")
        cand = _as_matrix(candidate_embs, "candidate_embs")
        if self.k_ > len(cand):
            raise ValueError(f"the selection budget k = {self.k_} is larger than the pool of {len(cand)} safety "
                             "candidates; lower ratio or k, or give a larger pool")
        if cand.shape[1] != self.reference_.shape[1]:
            raise ValueError(f"candidate_embs have dimension {cand.shape[1]}, reference_embs "
                             f"{self.reference_.shape[1]}")
        return cand


class RelevanceDiversityDPPSelector(_Selector):
    """Relevance-diversity DPP selection of safety data (SPARD).

    ``q_i = (max_j cos(s_i, r_j))^beta`` (relevance to the fine-tuning data, harmful samples included),
    ``L_ij = q_i cos(s_i, s_j) q_j + 1e-6 [i = j]``, greedy MAP of size ``k``.

    Args:
        beta: relevance power (paper: 4, robust in [4, 10]).
        ratio: budget as a fraction of the fine-tuning set, ``k = floor(ratio * n_reference)`` (paper: 0.03).
        k: an explicit budget instead of ``ratio``.

    Attributes (after ``select``): ``k_``, ``relevance_`` (q of every candidate), ``kernel_``.
    """

    def __init__(self, beta: float = 4.0, ratio: float | None = 0.03, k: int | None = None):
        super().__init__(ratio, k)
        self.beta = beta

    def select(self, candidate_embs: Any) -> np.ndarray:
        """Indices of the selected candidates, in pick order."""
        cand = self._candidates(candidate_embs)
        L, q = relevance_diversity_kernel(cand, self.reference_, self.beta)
        self.kernel_, self.relevance_ = L, q
        return greedy_dpp_map(L, self.k_)


class RandomSelector(_Selector):
    """The random baseline of the same size (the released ``RandomSafeDataSelector``), seeded.

    Args:
        ratio, k: the budget, as for :class:`RelevanceDiversityDPPSelector`.
        seed: the sampling seed.
    """

    def __init__(self, ratio: float | None = 0.03, k: int | None = None, seed: int = 0):
        super().__init__(ratio, k)
        self.seed = seed

    def select(self, candidate_embs: Any) -> np.ndarray:
        """``k_`` distinct indices drawn uniformly without replacement."""
        cand = self._candidates(candidate_embs)
        return np.sort(np.random.default_rng(self.seed).choice(len(cand), size=self.k_, replace=False))


def mean_last_hidden(model: Any, tokenizer: Any, texts: Sequence[str], *, batch_size: int = 16,
                     add_special_tokens: bool = False) -> np.ndarray:
    """Mean-pooled last-layer hidden states of ``model`` over each text's tokens: ``(len(texts), hidden)``.

    ``hidden_states[-1]`` of a ``transformers`` causal LM is the final (normed) hidden state, the quantity the
    released code pools from the base LLM. Padding is on the right and masked, so a batch gives each text the
    embedding it has alone.

    Raises:
        ValueError: an empty list of texts or an empty text.
    """
    import torch

    if isinstance(texts, str) or not texts:
        raise ValueError("texts must be a non-empty list of strings")
    if tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer has no pad token")
    was_training = model.training
    model.eval()
    side = tokenizer.padding_side
    tokenizer.padding_side = "right"
    out = []
    try:
        with torch.no_grad():
            for i in range(0, len(texts), batch_size):
                chunk = list(texts[i:i + batch_size])
                if any(not t for t in chunk):
                    raise ValueError("texts must not contain empty strings")
                enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=add_special_tokens)
                hidden = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                               output_hidden_states=True).hidden_states[-1]
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                out.append(((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)).double().numpy())
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return np.concatenate(out, axis=0)
