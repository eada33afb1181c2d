"""The embedded tasks of the Shampoo reproduction: digits MLP and CNN, a tiny transformer, matrix least squares.

Everything is bundled (sklearn digits) or generated from a seed; nothing is downloaded.

Example:
    >>> task = digits_mlp_task(seed=0)
    >>> task.name, task.X.shape[1]
    ('digits_mlp', 64)
    >>> ls = MatrixLeastSquares(m=4, n=3, seed=0)
    >>> ls.full_grad(ls.X_star).abs().max().item() < 1e-12
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..common.datasets import digits


@dataclass
class Task:
    """A supervised training task: data, a model factory and the full-data loss used for 'steps to target'."""

    name: str
    X: Tensor
    """training inputs (the full-data loss is computed on all of them)"""
    y: Tensor
    """training targets"""
    make_model: Callable[[int], nn.Module]
    """``make_model(seed)``: the same initialisation for every optimizer on a seed"""
    loss_fn: Callable[[Tensor, Tensor], Tensor]

    def full_loss(self, model: nn.Module) -> float:
        with torch.no_grad():
            return float(self.loss_fn(model(self.X), self.y))


def _ce(logits: Tensor, y: Tensor) -> Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def digits_mlp_task(seed: int, hidden: int = 128) -> Task:
    """sklearn digits, MLP 64-hidden-hidden-10 (the design notes' setting)."""
    d = digits(seed=seed)

    def make(s: int) -> nn.Module:
        torch.manual_seed(s)
        return nn.Sequential(
            nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10)
        )

    return Task("digits_mlp", torch.from_numpy(d.X_train), torch.from_numpy(d.y_train), make, _ce)


def digits_cnn_task(seed: int, channels: int = 8) -> Task:
    """sklearn digits as 1x8x8 images; two 3x3 conv layers, max-pool, linear head."""
    d = digits(seed=seed)

    def make(s: int) -> nn.Module:
        torch.manual_seed(s)
        return nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(2 * channels * 16, 10),
        )

    X = torch.from_numpy(d.X_train).reshape(-1, 1, 8, 8)
    return Task("digits_cnn", X, torch.from_numpy(d.y_train), make, _ce)


class TinyTransformer(nn.Module):
    """A bidirectional transformer encoder with a per-position classification head."""

    def __init__(self, vocab: int, length: int, d_model: int = 32, heads: int = 2, layers: int = 1):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(length, d_model) * 0.1)
        layer = nn.TransformerEncoderLayer(
            d_model, heads, dim_feedforward=2 * d_model, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.head(self.encoder(self.embed(tokens) + self.pos))


def reversal_task(seed: int, n: int = 1024, vocab: int = 16, length: int = 12) -> Task:
    """Synthetic sequences of ``length`` tokens; the target at position i is the token at length-1-i."""
    g = torch.Generator().manual_seed(10_000 + seed)
    X = torch.randint(0, vocab, (n, length), generator=g)

    def make(s: int) -> nn.Module:
        torch.manual_seed(s)
        return TinyTransformer(vocab, length)

    return Task("reversal_transformer", X, X.flip(1), make, _ce)


TASKS: dict[str, Callable[[int], Task]] = {
    "digits_mlp": digits_mlp_task,
    "digits_cnn": digits_cnn_task,
    "reversal_transformer": reversal_task,
}


class MatrixLeastSquares:
    """f(X) = 1/2 ||P (X - X*) Q||_F^2 with stochastic gradients grad f(X) + sigma Z (Z standard normal).

    P (m x m) and Q (n x n) have singular values spread log-uniformly over [1/sqrt(kappa), 1] so the problem is
    ill-conditioned on both sides (what Kronecker preconditioning addresses). Float64 throughout.
    """

    def __init__(self, m: int, n: int, seed: int, kappa: float = 10.0, sigma: float = 0.5):
        if m < 1 or n < 1:
            raise ValueError(f"m and n must be >= 1, got {m}, {n}")
        g = torch.Generator().manual_seed(seed)
        self.m, self.n, self.sigma = m, n, sigma

        def spread(d: int) -> Tensor:
            q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
            s = torch.logspace(0, -0.5 * math.log10(kappa), d, dtype=torch.float64)
            return q @ torch.diag(s) @ q.T

        self.P, self.Q = spread(m), spread(n)
        self.X_star = torch.randn(m, n, generator=g, dtype=torch.float64)
        self._noise = torch.Generator().manual_seed(seed + 1)

    def full_grad(self, X: Tensor) -> Tensor:
        # $$\nabla f(X) = P^\top P (X - X^*) Q Q^\top$$
        return self.P.T @ self.P @ (X - self.X_star) @ self.Q @ self.Q.T

    def stochastic_grad(self, X: Tensor) -> Tensor:
        z = torch.randn(self.m, self.n, generator=self._noise, dtype=torch.float64)
        return self.full_grad(X) + self.sigma * z

    def loss(self, X: Tensor) -> float:
        return 0.5 * float((self.P @ (X - self.X_star) @ self.Q).square().sum())
