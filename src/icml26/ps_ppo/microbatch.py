"""The update pass as a trainer runs it: token-balanced micro-batches, an activation meter, stratified cutoffs.

Shared by the reproduction (``experiment.update_pass``) and ``PSGRPOTrainer``, so that both process exactly the
same token positions for the same cutoffs:

- ``plan_micro_batches(keep_lengths, n_micro)``: rows sorted by kept length and cut into at most ``n_micro``
  contiguous micro-batches that minimise the largest padded micro-batch (rows x longest kept prefix), by dynamic
  programming; each micro-batch is then padded only to its own longest prefix;
- ``micro_batched_backward``: forward, loss and backward one micro-batch at a time (activations of one
  micro-batch alive at once), metering each micro-batch's activation memory;
- ``ActivationMeter``: the bytes autograd saves for backward, counted once per storage and without the
  parameters and buffers (what a trainer must provision beyond the weights);
- ``StratifiedCutoff``: within each group of rollouts of one prompt, the cutoffs' uniforms are stratified
  ((k + v_k) / n for a random permutation k), so a group always holds short and long prefixes; every row's
  marginal law is unchanged, hence the importance weights 1 / S(t) and the unbiasedness are too.

Example:
    >>> import torch
    >>> [r.tolist() for r in plan_micro_batches(torch.tensor([5, 30, 6, 29, 7, 31]), 2)]
    [[0, 2, 4], [3, 1, 5]]

Reference: reconstruction of PS-PPO (Hwang & Kim, ICML 2026, arXiv:2606.29758) from its abstract.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor


def plan_micro_batches(keep_lengths: Tensor, n_micro: int) -> list[Tensor]:
    """Rows split into at most ``n_micro`` micro-batches with balanced padded cost.

    Rows are sorted by kept length (so a micro-batch pads little); the sorted order is cut into contiguous
    pieces minimising max_k (rows_k * max kept length_k), the largest micro-batch's token positions, which
    sets the peak activation memory of the update.

    Args:
        keep_lengths: (B,) positions each row must process (prompt + kept completion tokens), >= 1.
        n_micro: the number of micro-batches (>= 1); fewer come back when there are fewer rows.

    Returns:
        a list of LongTensors of row indices (ascending kept length), together a partition of range(B).
    """
    if not isinstance(n_micro, int) or n_micro < 1:
        raise ValueError(f"n_micro must be a positive integer, got {n_micro!r}")
    if not isinstance(keep_lengths, Tensor) or keep_lengths.ndim != 1 or len(keep_lengths) == 0:
        raise TypeError("keep_lengths must be a non-empty 1-D tensor")
    if (keep_lengths < 1).any():
        raise ValueError("keep_lengths must be >= 1")
    order = torch.argsort(keep_lengths.cpu(), stable=True)
    sorted_len = keep_lengths.cpu()[order].numpy().astype(np.int64)
    B, M = len(sorted_len), min(n_micro, len(sorted_len))
    # cost[j, i]: a micro-batch of sorted rows j..i-1 (i > j) pads to sorted_len[i - 1]
    j = np.arange(B + 1)[:, None]
    i = np.arange(B + 1)[None, :]
    cost = np.where(i > j, (i - j) * sorted_len[np.maximum(i - 1, 0)], np.iinfo(np.int64).max // 4)
    best = cost[0].copy()  # best[i]: the smallest largest-cost of the first i rows in k pieces
    back = [np.zeros(B + 1, dtype=np.int64)]
    for _ in range(1, M):
        cand = np.maximum(best[:, None], cost)  # (j, i): the first j rows as before, then j..i-1
        cand[0, :] = cost[0]  # fewer pieces allowed (the empty split)
        arg = cand.argmin(0)
        best = cand[arg, np.arange(B + 1)]
        back.append(arg)
    cuts, end = [], B
    for arg in reversed(back):
        start = int(arg[end])
        cuts.append((start, end))
        end = start
        if end == 0:
            break
    return [order[s:e] for s, e in reversed(cuts) if e > s]


class ActivationMeter:
    """Bytes of the tensors autograd saves for backward while open: each storage once, parameters excluded.

    A saved tensor is attributed its whole storage (a view keeps its base alive); two saved views of one storage
    count once; tensors sharing a storage with an excluded tensor (the module's parameters and buffers, e.g. a
    transposed weight that a linear layer saves) count zero. ``bytes`` is then the activation memory the
    forward pass leaves for backward, which ``tests/ps_ppo/test_meter.py`` checks against ``torch.profiler``'s
    memory events.

    Args:
        exclude: a module (its parameters and buffers) or tensors whose storages are not activations.

    Example:
        >>> lin = torch.nn.Linear(4, 8)
        >>> with ActivationMeter(lin) as m:
        ...     y = torch.relu(lin(torch.ones(2, 4)))
        >>> m.bytes  # the input (2x4) and the ReLU output (2x8), float32; the weight is excluded
        96
    """

    def __init__(self, exclude: torch.nn.Module | Iterable[Tensor] = ()) -> None:
        tensors = (
            [*exclude.parameters(), *exclude.buffers()]
            if isinstance(exclude, torch.nn.Module)
            else list(exclude)
        )
        self._excluded = {t.untyped_storage().data_ptr() for t in tensors}
        self._storages: dict[int, int] = {}

    @property
    def bytes(self) -> int:
        """Unique saved bytes so far."""
        return sum(self._storages.values())

    def __enter__(self) -> ActivationMeter:
        def pack(t: Tensor) -> Tensor:
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr not in self._excluded and storage.nbytes() > 0:
                self._storages[ptr] = max(self._storages.get(ptr, 0), storage.nbytes())
            return t

        self._hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)


@dataclass
class PassStats:
    """What one micro-batched backward pass cost."""

    tokens: int
    """token positions processed (rows x padded width, summed over micro-batches)"""
    peak_bytes: int
    """the largest micro-batch's activation memory (``ActivationMeter``)"""
    saved_bytes: int
    """activation memory summed over micro-batches"""
    loss: float
    """the summed loss"""
    micro_batches: int


def micro_batched_backward(
    keep_lengths: Tensor,
    n_micro: int,
    loss_of: Callable[[Tensor, int], Tensor],
    *,
    model: torch.nn.Module,
    backward: Callable[[Tensor], Any] | None = None,
) -> PassStats:
    """Forward, loss and backward one token-balanced micro-batch at a time (gradients accumulate).

    Args:
        keep_lengths: (B,) positions each row must process (prompt + kept completion).
        n_micro: number of micro-batches (``plan_micro_batches``).
        loss_of: ``loss_of(rows, width)`` -> the loss of rows ``rows`` (its share of the batch objective),
            computed on the first ``width`` positions.
        model: the trained module (its parameters are excluded from the activation memory).
        backward: how to backpropagate (default ``loss.backward()``; a trainer passes ``accelerator.backward``);
            skipped when the loss needs no gradient (evaluation).

    Returns:
        ``PassStats``.
    """
    stats = PassStats(0, 0, 0, 0.0, 0)
    for rows in plan_micro_batches(keep_lengths, n_micro):
        width = int(keep_lengths[rows].max())
        with ActivationMeter(model) as meter:
            loss = loss_of(rows, width)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"the micro-batch loss is {float(loss)}")
        if loss.requires_grad:
            (backward or Tensor.backward)(loss)
        stats.tokens += len(rows) * width
        stats.peak_bytes = max(stats.peak_bytes, meter.bytes)
        stats.saved_bytes += meter.bytes
        stats.loss += float(loss.detach())
        stats.micro_batches += 1
    return stats


class StratifiedCutoff:
    """A cutoff law whose draws are stratified within each group of rows sharing a prompt key.

    For a group of n rows, u_k = (pi(k) + v_k) / n with a random permutation pi and v_k ~ U[0, 1), and
    c_k = #{t : S_k(t) > u_k} (the inverse of the survival function: P(c_k >= t) = P(u_k < S_k(t)) = S_k(t)).
    Each row's marginal law is the base law's, so ``survival`` is the base law's and the 1 / S(t) weights keep
    the estimator unbiased; across the group the uniforms cover [0, 1) evenly, which lowers the variance of the
    group's gradient and balances its kept tokens.

    Args:
        base: the cutoff law (``UniformCutoff``, ``MixtureCutoff``, ``PromptConditionedCutoff``, ...).

    Example:
        >>> from icml26.ps_ppo import UniformCutoff
        >>> law = StratifiedCutoff(UniformCutoff())
        >>> law.sample(torch.tensor([8, 8, 8, 8]), torch.Generator().manual_seed(0), keys=["a"] * 4).sort().values
        tensor([2, 4, 6, 8])
    """

    def __init__(self, base: Any):
        self.base = base

    def survival(self, lengths: Tensor, max_len: int, keys: list[Hashable] | None = None) -> Tensor:
        return self.base.survival(lengths, max_len, keys=keys)

    def sample(
        self, lengths: Tensor, generator: torch.Generator | None = None, keys: list[Hashable] | None = None
    ) -> Tensor:
        if not isinstance(lengths, Tensor) or lengths.ndim != 1:
            raise TypeError("lengths must be a 1-D LongTensor of completion lengths")
        survival = self.base.survival(lengths, int(lengths.max()), keys=keys).double()
        groups: dict[Hashable, list[int]] = {}
        for i, k in enumerate(keys if keys is not None else [None] * len(lengths)):
            groups.setdefault(k, []).append(i)
        u = torch.empty(len(lengths), dtype=torch.float64)
        for rows in groups.values():
            n = len(rows)
            perm = torch.randperm(n, generator=generator).double()
            v = torch.rand(n, generator=generator, dtype=torch.float64)
            u[rows] = (perm + v) / n
        return (survival > u[:, None]).sum(1).clamp(min=1).long()


class FullCutoff:
    """The degenerate law c = L (the whole trajectory): S(t) = 1 for t <= L; a mixture component that bounds the
    importance weights (``MixtureCutoff([FullCutoff(), UniformCutoff()], [w, 1 - w])`` has weights <= 1 / w)."""

    def sample(self, lengths: Tensor, generator: torch.Generator | None = None, keys: Any = None) -> Tensor:
        if not isinstance(lengths, Tensor) or lengths.ndim != 1 or (lengths < 1).any():
            raise ValueError("lengths must be a 1-D tensor of positive lengths")
        return lengths.long().clone()

    def survival(self, lengths: Tensor, max_len: int, keys: Any = None) -> Tensor:
        if not isinstance(lengths, Tensor) or lengths.ndim != 1 or (lengths < 1).any():
            raise ValueError("lengths must be a 1-D tensor of positive lengths")
        t = torch.arange(1, max_len + 1)[None, :]
        return (t <= lengths[:, None]).float()
