"""Effective rank of VQ codebooks and the codebook decorrelation regulariser, as torch functions and modules.

- ``effective_rank(x)``: Roy & Vetterli's effective rank of a centred matrix, exp(-sum_i p_i log p_i) with
  p = s / sum(s) over its singular values s (also the participation ratio and the stable rank);
  ``spectral_report`` adds the dimensions holding 90 % / 99 % of the variance (from s^2).
- ``codebook_decorrelation_loss(C)``: the official ``codebook_orth`` penalty: row-normalise the codebook,
  G = Cn^T Cn (D x D), L_cr = sum_{i != j} G_ij^2 / (D (D - 1)).
- ``CodebookRegularizer(quantizer, weight)``: wraps any quantiser returning ``(quantized, indices, loss)`` and
  adds ``weight * L_cr`` of its *effective* codebook (the projected one for SimVQ) to its loss; works with this
  module's ``VectorQuantizer`` / ``SimVQQuantizer`` and with ``vector_quantize_pytorch.VectorQuantize``
  (learnable codebook) and ``SimVQ``; an EMA codebook has no gradient and raises.
- ``VectorQuantizer`` (learnable codebook) and ``SimVQQuantizer`` (frozen Gaussian basis, std D^-1/2, with a
  learnable linear map), both with the "legacy" commitment loss ||sg(q) - z||^2 + beta ||q - sg(z)||^2 and the
  straight-through estimator.

Example:
    >>> import torch
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> quantizer = CodebookRegularizer(SimVQQuantizer(codebook_size=64, dim=8), weight=1e-2)
    >>> q, idx, loss = quantizer(torch.randn(32, 8))
    >>> q.shape, idx.shape, bool(loss > 0)
    (torch.Size([32, 8]), torch.Size([32]), True)
    >>> round(effective_rank(torch.eye(4)), 3)   # centred identity: rank 3, flat spectrum
    3.0

Reference: "Unveiling and Addressing Dimensional Collapse in Vector Quantization Models via Codebook
Regularization", ICML 2026 (official code: github.com/ksblk2116/dimvq); O. Roy, M. Vetterli, "The effective rank:
a measure of effective dimensionality", EUSIPCO 2007.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

KINDS = ("roy_vetterli", "participation_ratio", "stable_rank")


def _check_matrix(x: Tensor, name: str = "x") -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D (N, D), got shape {tuple(x.shape)}")
    if not torch.isfinite(x).all():
        raise ValueError(f"{name} has NaN or Inf entries")
    return x


def singular_values(x: Tensor, center: bool = True) -> Tensor:
    """Singular values of ``x`` (rows centred first by default), in float64."""
    x = _check_matrix(x).detach().to(torch.float64)
    if center:
        x = x - x.mean(dim=0, keepdim=True)
    return torch.linalg.svdvals(x)


def effective_rank(x: Tensor, center: bool = True, kind: str = "roy_vetterli", eps: float = 1e-12) -> float:
    """Effective rank of the rows of ``x`` (N, D).

    Args:
        x: codebook or features, one vector per row; needs at least 2 rows (after centring, rank <= N - 1).
        center: subtract the mean row first (the official analysis does).
        kind: ``"roy_vetterli"`` exp(-sum p log p), p = s / sum s over singular values (the paper's);
            ``"participation_ratio"`` (sum s^2)^2 / sum s^4; ``"stable_rank"`` ||x||_F^2 / ||x||_2^2.
        eps: singular values below ``eps * max(s)`` are dropped.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if x.shape[0] < 2:
        raise ValueError(f"need at least 2 vectors to measure a rank, got {x.shape[0]}")
    s = singular_values(x, center)
    s = s[s > eps * s.max()] if s.numel() and s.max() > 0 else s[:0]
    if s.numel() == 0:
        return 0.0
    if kind == "roy_vetterli":
        p = s / s.sum()
        # $$\mathrm{erank} = \exp\left(-\sum_i p_i \log p_i\right), \quad p_i = s_i / \sum_j s_j$$
        return float(torch.exp(-(p * p.log()).sum()))
    lam = s**2
    if kind == "participation_ratio":
        return float(lam.sum() ** 2 / (lam**2).sum())
    return float(lam.sum() / lam.max())


def spectral_report(
    codebook: Tensor, features: Tensor | None = None, used: Tensor | None = None
) -> dict[str, float]:
    """Effective rank (Roy-Vetterli, centred, singular values) of all codes, of the used codes and of the
    features, with the dimensions holding 90 % and 99 % of the codebook's variance.

    Raises:
        ValueError: fewer codes than dimensions (the rank would be capped by the count), NaN codes.
    """
    _check_matrix(codebook, "codebook")
    K, D = codebook.shape
    if K < D:
        raise ValueError(f"the codebook has {K} codes for {D} dimensions: its rank cannot reach D")
    s2 = singular_values(codebook) ** 2
    share = torch.cumsum(s2, 0) / s2.sum()
    out = {
        "codebook_erank": effective_rank(codebook),
        "dims_90": float(int((share < 0.90).sum()) + 1),
        "dims_99": float(int((share < 0.99).sum()) + 1),
    }
    if used is not None:
        active = codebook[used]
        out["used_codes"] = float(active.shape[0])
        out["used_erank"] = effective_rank(active) if active.shape[0] >= 2 else 0.0
    if features is not None:
        out["feature_erank"] = effective_rank(features)
    return out


def codebook_decorrelation_loss(codebook: Tensor, kind: str = "gram_offdiag") -> Tensor:
    """The regulariser on a (K, D) codebook (differentiable).

    ``"gram_offdiag"`` (official ``codebook_orth``): L = sum_{i != j} G_ij^2 / (D (D - 1)), G = Cn^T Cn with Cn
    the row-L2-normalised codebook. ``"barlow"``: mean((C_std^T C_std / K - I)^2), C standardised per dimension.
    """
    _check_matrix(codebook, "codebook")
    K, D = codebook.shape
    if D < 2:
        raise ValueError("the codebook needs at least 2 dimensions")
    if kind == "gram_offdiag":
        cn = nn.functional.normalize(codebook, dim=1)
        # $$G = C_n^\top C_n, \qquad \mathcal{L}_{cr} = \frac{\sum_{i \ne j} G_{ij}^2}{D(D-1)}$$
        gram = cn.T @ cn
        off = gram - torch.diag(torch.diagonal(gram))
        return (off**2).sum() / (D * (D - 1))
    if kind == "barlow":
        c = (codebook - codebook.mean(0)) / (codebook.std(0) + 1e-6)
        return ((c.T @ c / K - torch.eye(D, device=codebook.device, dtype=codebook.dtype)) ** 2).mean()
    raise ValueError(f"kind must be 'gram_offdiag' or 'barlow', got {kind!r}")


def codebook_tensor(quantizer: nn.Module) -> Tensor:
    """The (K, D) effective codebook of a quantiser (``effective_codebook()`` or ``.codebook``), as it is."""
    if hasattr(quantizer, "effective_codebook"):
        cb = quantizer.effective_codebook()
    elif hasattr(quantizer, "codebook"):
        cb = quantizer.codebook
    else:
        raise TypeError(f"{type(quantizer).__name__} exposes no codebook; pass codebook_getter=...")
    if not isinstance(cb, Tensor):
        raise TypeError(f"the codebook of {type(quantizer).__name__} is not a tensor")
    return cb[0] if cb.ndim == 3 and cb.shape[0] == 1 else cb


def codebook_of(quantizer: nn.Module) -> Tensor:
    """The effective (K, D) codebook of a quantiser, with its gradient.

    Supports this module's quantisers (``effective_codebook()``), ``vector_quantize_pytorch.SimVQ`` and
    ``VectorQuantize`` with ``learnable_codebook=True, ema_update=False`` (``.codebook``).

    Raises:
        ValueError: an EMA codebook (no gradient: the regulariser would silently do nothing).
        TypeError: a quantiser without an accessible codebook (pass ``codebook_getter``).
    """
    cb = codebook_tensor(quantizer)
    if not cb.requires_grad:
        raise ValueError(
            f"the codebook of {type(quantizer).__name__} has no gradient (an EMA-updated codebook?): the "
            "regulariser would do nothing; use learnable_codebook=True, ema_update=False"
        )
    return cb


class CodebookRegularizer(nn.Module):
    """Wrap a quantiser and add ``weight * codebook_decorrelation_loss`` of its effective codebook to its loss.

    Args:
        quantizer: a module whose forward returns ``(quantized, indices, loss)``.
        weight: lambda (official default 1e-3, "robust in [1e-3, 1e-1]"); 0 turns the penalty off.
        kind: ``"gram_offdiag"`` (official) or ``"barlow"``.
        codebook_getter: ``fn(quantizer) -> (K, D) tensor`` for quantisers ``codebook_of`` does not know.
    """

    def __init__(
        self,
        quantizer: nn.Module,
        weight: float = 1e-3,
        kind: str = "gram_offdiag",
        codebook_getter: Callable[[nn.Module], Tensor] | None = None,
    ):
        super().__init__()
        if (
            isinstance(weight, bool)
            or not isinstance(weight, (int, float))
            or not math.isfinite(weight)
            or weight < 0
        ):
            raise ValueError(f"weight must be a finite number >= 0, got {weight!r}")
        if kind not in ("gram_offdiag", "barlow"):
            raise ValueError(f"kind must be 'gram_offdiag' or 'barlow', got {kind!r}")
        self.quantizer, self.weight, self.kind = quantizer, float(weight), kind
        self.codebook_getter = codebook_getter or codebook_of
        if self.weight > 0:
            self.codebook_getter(quantizer)  # fail now, not silently later (EMA codebooks)
        self.last_penalty: float | None = None

    def penalty(self) -> Tensor:
        return codebook_decorrelation_loss(self.codebook_getter(self.quantizer), self.kind)

    def forward(self, x: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor, Tensor]:
        quantized, indices, loss = self.quantizer(x, *args, **kwargs)
        if self.weight > 0 and self.training:
            reg = self.penalty()
            self.last_penalty = float(reg.detach())
            # $$\mathcal{L} = \mathcal{L}_{rec} + \mathcal{L}_{commit} + \lambda \mathcal{L}_{cr}$$
            loss = loss + self.weight * reg
        return quantized, indices, loss


def _nearest(z: Tensor, codebook: Tensor) -> Tensor:
    d = z.pow(2).sum(1, keepdim=True) - 2 * z @ codebook.T + codebook.pow(2).sum(1)
    return d.argmin(1)


class VectorQuantizer(nn.Module):
    """Nearest-neighbour VQ with a learnable codebook, the legacy commitment loss and straight-through gradients.

    loss = ||sg(q) - z||^2 + beta ||q - sg(z)||^2 (means), quantized = z + sg(q - z).
    """

    def __init__(self, codebook_size: int, dim: int, beta: float = 0.25, init_std: float | None = None):
        super().__init__()
        if codebook_size < 1 or dim < 1:
            raise ValueError(f"codebook_size and dim must be >= 1, got {codebook_size}, {dim}")
        std = dim**-0.5 if init_std is None else init_std
        self.embed = nn.Parameter(torch.randn(codebook_size, dim) * std)
        self.beta = beta

    def effective_codebook(self) -> Tensor:
        return self.embed

    def forward(self, z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        shape = z.shape
        flat = z.reshape(-1, shape[-1])
        codebook = self.effective_codebook()
        idx = _nearest(flat.detach(), codebook.detach())
        q = codebook[idx]
        # $$\|sg(q) - z\|^2 + \beta \|q - sg(z)\|^2$$   ("legacy" commitment of the official code)
        loss = ((q.detach() - flat) ** 2).mean() + self.beta * ((q - flat.detach()) ** 2).mean()
        quantized = flat + (q - flat).detach()
        return quantized.reshape(shape), idx.reshape(shape[:-1]), loss


class SimVQQuantizer(VectorQuantizer):
    """SimVQ: a frozen Gaussian basis C (std D^-1/2) and a learnable affine map; the codebook is C W^T + b.

    The projection has a bias, as the official code's ``nn.Linear(e_dim, e_dim)`` (vector-quantize-pytorch's
    ``SimVQ`` uses ``bias=False``; pass ``bias=False`` for that form).

    Args:
        codebook_size: K.
        dim: D (the basis and the codes have the same width).
        beta: commitment weight of the legacy loss.
        bias: give the projection a bias (official code).
        dead_code_threshold: restart codes whose exponential moving average of assignments per batch falls
            below this number (0 turns restarts off); the rule of vector-quantize-pytorch's
            ``threshold_ema_dead_code``, which that library offers for ``VectorQuantize`` but not for ``SimVQ``.
        dead_code_decay: decay of that moving average (vector-quantize-pytorch's default 0.8).
    """

    def __init__(
        self,
        codebook_size: int,
        dim: int,
        beta: float = 0.25,
        bias: bool = True,
        dead_code_threshold: float = 0.0,
        dead_code_decay: float = 0.8,
    ):
        nn.Module.__init__(self)
        if codebook_size < 1 or dim < 1:
            raise ValueError(f"codebook_size and dim must be >= 1, got {codebook_size}, {dim}")
        if not math.isfinite(dead_code_threshold) or dead_code_threshold < 0:
            raise ValueError(f"dead_code_threshold must be a finite number >= 0, got {dead_code_threshold!r}")
        if not 0.0 <= dead_code_decay < 1.0:
            raise ValueError(f"dead_code_decay must be in [0, 1), got {dead_code_decay!r}")
        self.register_buffer("frozen", torch.randn(codebook_size, dim) * dim**-0.5)
        self.projection = nn.Linear(dim, dim, bias=bias)
        self.beta = beta
        self.dead_code_threshold, self.dead_code_decay = float(dead_code_threshold), float(dead_code_decay)
        # vector-quantize-pytorch starts its cluster sizes at 1 (every code alive)
        self.register_buffer("cluster_size", torch.ones(codebook_size))
        self.restarts = 0

    def effective_codebook(self) -> Tensor:
        return self.projection(self.frozen)

    def forward(self, z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        quantized, idx, loss = super().forward(z)
        if self.dead_code_threshold > 0 and self.training:
            self._expire_codes(z.detach().reshape(-1, z.shape[-1]), idx.reshape(-1))
        return quantized, idx, loss

    @torch.no_grad()
    def _expire_codes(self, flat: Tensor, idx: Tensor) -> None:
        counts = torch.bincount(idx, minlength=self.frozen.shape[0]).to(self.cluster_size.dtype)
        # $$n_k \leftarrow \gamma n_k + (1 - \gamma) \#\{i : c_i = k\}$$   (vector-quantize-pytorch's EMA)
        self.cluster_size.mul_(self.dead_code_decay).add_(counts, alpha=1 - self.dead_code_decay)
        dead = (self.cluster_size < self.dead_code_threshold).nonzero().flatten()
        if dead.numel() == 0:
            return
        dead = dead[torch.randperm(dead.numel())[: flat.shape[0]]]  # at most one restart per batch vector
        targets = flat[torch.randperm(flat.shape[0])[: dead.numel()]]
        # the effective code W f + b should become a batch vector z: f = W^+ (z - b) (its projection on the
        # range of W when W is rank-deficient, so a restart cannot add rank the projection lacks)
        w = self.projection.weight
        b = self.projection.bias if self.projection.bias is not None else torch.zeros_like(targets[0])
        frozen = self.frozen.clone()  # a new tensor: the graph of this step still holds the old basis
        frozen[dead] = (targets - b) @ torch.linalg.pinv(w).T
        self.frozen = frozen
        self.cluster_size[dead] = self.dead_code_threshold  # vector-quantize-pytorch's reset_cluster_size
        self.restarts += int(dead.numel())


class EffectiveRankCallback:
    """Record the codebook's effective rank every ``every`` steps: ``cb(step, quantizer)``; history in ``.history``."""

    def __init__(self, every: int = 100, getter: Callable[[nn.Module], Tensor] | None = None):
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.every, self.getter = every, getter or codebook_tensor
        self.history: list[tuple[int, float]] = []

    def __call__(self, step: int, quantizer: nn.Module) -> float | None:
        if step % self.every:
            return None
        value = effective_rank(self.getter(quantizer).detach())
        self.history.append((step, value))
        return value
