"""Reproduction of dimensional collapse in VQ codebooks and of the codebook regulariser, on natural-image patches.

A convolutional VQ-VAE (two stride-2 convolutions: a 16 x 16 contrast-normalised grey patch becomes 4 x 4 = 16 token positions of
width D, a quantiser, two transposed convolutions back) reconstructs patches of scikit-learn's two bundled
photographs (``data.py``; train and test patches from disjoint parts of each photograph). Every arm trains the
same architecture from the same initialisation on the same batches:

- ``simvq``: SimVQ (frozen Gaussian basis, learnable affine projection with a bias, as the official code);
- ``simvq_cr``: + the codebook regulariser at the official default lambda = 1e-3 (the paper's method);
- ``simvq_cr_strong``: lambda = 1e-2 (full preset);
- ``simvq_restart`` / ``simvq_cr_restart``: both with dead-code restarts (vector-quantize-pytorch's
  ``threshold_ema_dead_code`` rule, ``SimVQQuantizer(dead_code_threshold=...)``), so code usage cannot collapse;
- ``simvq_matched``: SimVQ without the regulariser at K = the number of codes ``simvq_cr`` uses on the train
  patches of the same seed (the comparison at matched code usage);
- ``vq``: a learnable codebook (full preset);
- ``ae``: the same network without quantisation (the ceiling: what a continuous code reconstructs);
- ``mean``: every patch reconstructed as the mean train patch (the trivial baseline).

Metrics on the held-out patches: per-patch reconstruction MSE (in units of the patch's contrast; the unit of the
fidelity checks, each identified by its photograph and position, ``data.patch_ids``: the same patch drawn twice
is one unit, and the train patches' ids are recorded as held out); codes
used on the train patches; effective rank (Roy-Vetterli, centred, singular values) of all codes, of the used
codes and of the held-out encoder outputs z_e, and the ratio used / z_e.

Example:
    >>> import dataclasses
    >>> from icml26.vq_rank.experiment import PRESETS, run
    >>> cfg = dataclasses.replace(PRESETS["smoke"], steps=10, arms=("simvq", "simvq_cr"), n_train=256, n_test=40)
    >>> out = run(cfg)
    >>> sorted(out.metrics["simvq_cr"])[:3], len(out.units["patches"]["simvq_cr"]["test_mse"])
    (['codebook_erank', 'codebook_size', 'erank_ratio'], 40)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..common.plotting import new_figure, save_figure
from ..common.progress import progress
from ..common.results import SeedRun
from .data import patch_ids, patches
from .module import CodebookRegularizer, SimVQQuantizer, VectorQuantizer, codebook_tensor, effective_rank

ARMS = (
    "mean",
    "ae",
    "simvq",
    "simvq_cr",
    "simvq_cr_strong",
    "simvq_restart",
    "simvq_cr_restart",
    "simvq_matched",
    "vq",
)
#: arms without a codebook
CONTINUOUS = ("mean", "ae")


@dataclass
class Config:
    """Settings of one seed's run (``PRESETS`` holds smoke / quick / full)."""

    seed: int = 0
    """seed of the patch positions, the initialisation and the batches"""
    arms: tuple[str, ...] = (
        "mean",
        "ae",
        "simvq",
        "simvq_cr",
        "simvq_restart",
        "simvq_cr_restart",
        "simvq_matched",
    )
    """arms to train (see the module docstring); ``simvq_matched`` needs ``simvq_cr`` before it"""
    steps: int = 300
    """training steps per arm"""
    batch_size: int = 64
    """mini-batch size (patches)"""
    lr: float = 2e-3
    """Adam learning rate"""
    n_train: int = 8000
    """train patches"""
    n_test: int = 500
    """held-out test patches (the units of the fidelity checks)"""
    codebook_size: int = 256
    """K"""
    dim: int = 32
    """D, the code width (channels of the latent grid)"""
    channels: int = 32
    """hidden channels of the encoder and decoder"""
    beta: float = 0.25
    """commitment weight of the legacy VQ loss"""
    reg_weight: float = 1e-3
    """lambda of the codebook regulariser (official default; "robust in [1e-3, 1e-1]")"""
    strong_reg_weight: float = 1e-2
    """lambda of ``simvq_cr_strong``"""
    dead_code_fraction: float = 0.1
    """restart arms: restart a code whose moving average of assignments per batch drops below this fraction of
    the average assignments per code (batch tokens / K); vector-quantize-pytorch's threshold_ema_dead_code"""
    threads: int = 1
    """torch intra-op threads"""


PRESETS: dict[str, Config] = {
    "smoke": Config(steps=25, n_train=512, n_test=200),
    "quick": Config(),
    "full": Config(steps=1000, codebook_size=1024, channels=48, arms=ARMS),
}


class ConvVQVAE(nn.Module):
    """Conv encoder (16 x 16 -> 4 x 4 x D) -> quantiser over the 16 token positions -> transposed-conv decoder.

    ``quantizer=None`` is the continuous autoencoder (the ceiling arm).
    """

    def __init__(self, quantizer: nn.Module | None, cfg: Config):
        super().__init__()
        c, d = cfg.channels, cfg.dim
        self.encoder = nn.Sequential(
            nn.Conv2d(1, c, 4, 2, 1), nn.ReLU(), nn.Conv2d(c, c, 4, 2, 1), nn.ReLU(), nn.Conv2d(c, d, 1)
        )
        self.decoder = nn.Sequential(
            nn.Conv2d(d, c, 3, 1, 1),
            nn.ReLU(),
            nn.ConvTranspose2d(c, c, 4, 2, 1),
            nn.ReLU(),
            nn.ConvTranspose2d(c, 1, 4, 2, 1),
        )
        self.quantizer = quantizer

    def encode(self, x: Tensor) -> Tensor:
        """(B, 1, H, W) -> (B, positions, D)."""
        return self.encoder(x).flatten(2).transpose(1, 2)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(reconstruction, z_e, code indices (B, positions), quantiser loss)``."""
        z = self.encode(x)
        if self.quantizer is None:
            q, idx, loss = z, torch.zeros(z.shape[:2], dtype=torch.long), z.new_zeros(())
        else:
            q, idx, loss = self.quantizer(z)
        side = math.isqrt(z.shape[1])
        return self.decoder(q.transpose(1, 2).reshape(x.shape[0], -1, side, side)), z, idx, loss


def make_quantizer(arm: str, cfg: Config, codebook_size: int | None = None) -> nn.Module | None:
    """The quantiser of ``arm`` (``None`` for the continuous autoencoder)."""
    K, D = codebook_size or cfg.codebook_size, cfg.dim
    # tokens per batch: 16 positions per 16 x 16 patch
    threshold = cfg.dead_code_fraction * cfg.batch_size * 16 / K
    simvq = {
        "simvq": (0.0, 0.0),
        "simvq_matched": (0.0, 0.0),
        "simvq_cr": (cfg.reg_weight, 0.0),
        "simvq_cr_strong": (cfg.strong_reg_weight, 0.0),
        "simvq_restart": (0.0, threshold),
        "simvq_cr_restart": (cfg.reg_weight, threshold),
    }
    if arm == "ae":
        return None
    if arm == "vq":
        return VectorQuantizer(K, D, beta=cfg.beta)
    if arm in simvq:
        weight, threshold = simvq[arm]
        inner = SimVQQuantizer(K, D, beta=cfg.beta, dead_code_threshold=threshold)
        return CodebookRegularizer(inner, weight=weight) if weight > 0 else inner
    raise ValueError(f"unknown arm {arm!r}; arms are {ARMS}")


def _inner(model: ConvVQVAE) -> nn.Module:
    q = model.quantizer
    return q.quantizer if isinstance(q, CodebookRegularizer) else q


def train_vqvae(arm: str, cfg: Config, X: Tensor, codebook_size: int | None = None) -> ConvVQVAE:
    """Train one arm's VQ-VAE on ``X`` (N, 1, 16, 16)."""
    torch.manual_seed(cfg.seed)
    model = ConvVQVAE(make_quantizer(arm, cfg, codebook_size), cfg)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    batches = torch.Generator().manual_seed(cfg.seed)
    model.train()
    for step in range(cfg.steps):
        x = X[torch.randint(0, X.shape[0], (cfg.batch_size,), generator=batches)]
        recon, _, _, qloss = model(x)
        # $$\mathcal{L} = \|x - \hat x\|^2 + \mathcal{L}_{commit} (+ \lambda \mathcal{L}_{cr})$$
        loss = nn.functional.mse_loss(recon, x) + qloss
        if not torch.isfinite(loss):
            raise FloatingPointError(f"{arm}: the loss became {float(loss)} at step {step}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return model.eval()


def per_image_mse(model: ConvVQVAE, X: Tensor) -> np.ndarray:
    """Each patch's reconstruction MSE (mean over its pixels, float64); their mean is the test MSE."""
    with torch.no_grad():
        rec = model(X)[0]
    return ((rec.double() - X.double()) ** 2).flatten(1).mean(dim=1).numpy()


def used_codes(model: ConvVQVAE, X: Tensor) -> Tensor:
    """The indices of the codes the quantiser assigns to at least one token of ``X`` (train patches)."""
    with torch.no_grad():
        return torch.unique(model(X)[2])


def evaluate(
    model: ConvVQVAE, cfg: Config, X_tr: Tensor, X_te: Tensor
) -> tuple[dict[str, float], np.ndarray]:
    """``(metrics, per-patch test MSE)`` of a trained arm."""
    per_image = per_image_mse(model, X_te)
    metrics: dict[str, float] = {}
    if model.quantizer is not None:
        with torch.no_grad():
            z_te = model.encode(X_te).reshape(-1, cfg.dim)
        codebook = codebook_tensor(_inner(model)).detach()
        used = used_codes(model, X_tr)
        used_erank = effective_rank(codebook[used]) if used.numel() >= 2 else 0.0
        feature_erank = effective_rank(z_te)
        metrics = {
            "codebook_size": float(codebook.shape[0]),
            "used_codes": float(used.numel()),
            "codebook_erank": effective_rank(codebook),
            "used_erank": used_erank,
            "feature_erank": feature_erank,
            "erank_ratio": used_erank / feature_erank if feature_erank > 0 else float("nan"),
            "restarts": float(getattr(_inner(model), "restarts", 0)),
        }
    return metrics, per_image


def run(cfg: Config) -> SeedRun:
    """One seed: train and evaluate every arm on the same patches."""
    if "simvq_matched" in cfg.arms and (
        "simvq_cr" not in cfg.arms or cfg.arms.index("simvq_cr") > cfg.arms.index("simvq_matched")
    ):
        raise ValueError("arms: simvq_matched takes its codebook size from simvq_cr, which must come first")
    unknown = set(cfg.arms) - set(ARMS)
    if unknown:
        raise ValueError(f"arms: unknown {sorted(unknown)}; arms are {ARMS}")
    torch.set_num_threads(cfg.threads)
    tr, te = patches(seed=cfg.seed, n_train=cfg.n_train, n_test=cfg.n_test)
    X_tr, X_te = torch.from_numpy(tr), torch.from_numpy(te)
    metrics: dict[str, dict[str, float]] = {}
    units: dict[str, dict[str, list[float]]] = {}
    for arm in progress(cfg.arms, desc=f"vq_rank seed {cfg.seed}"):
        if arm == "mean":
            per_image = ((X_te.double() - X_tr.double().mean(0)) ** 2).flatten(1).mean(1).numpy()
            metrics[arm] = {}
        else:
            size = int(metrics["simvq_cr"]["used_codes"]) if arm == "simvq_matched" else None
            model = train_vqvae(arm, cfg, X_tr, codebook_size=size)
            metrics[arm], per_image = evaluate(model, cfg, X_tr, X_te)
        units[arm] = {"test_mse": per_image.tolist()}
    train_ids, test_ids = patch_ids(seed=cfg.seed, n_train=cfg.n_train, n_test=cfg.n_test)
    # every arm trains on the train patches (the mean arm averages them); nothing is tuned on held-out patches
    return SeedRun(metrics, series={"arms": list(cfg.arms)}, units={"patches": units},
                   unit_ids={"patches": test_ids}, held_out={"patches": {"train": train_ids, "validation": []}})


def plot(runs: list[SeedRun], result: dict[str, Any], out_dir: Path) -> list[Path]:
    """Test MSE against the used codes' effective rank per quantised arm (mean over seeds); the ceiling (``ae``)
    and the trivial baseline (``mean``) as horizontal lines; the z_e rank as a vertical line."""
    fig, ax = new_figure()
    arms = result["arms"]
    coded = [a for a in runs[0].series["arms"] if a not in CONTINUOUS]
    for arm in coded:
        x, y = arms[arm]["used_erank"]["mean"], arms[arm]["test_mse"]["mean"]
        ax.scatter([x], [y], s=30, label=f"{arm} ({arms[arm]['used_codes']['mean']:.0f} codes used)")
    for arm, style in (("ae", "--"), ("mean", ":")):
        if arm in arms:
            ax.axhline(arms[arm]["test_mse"]["mean"], color="grey", ls=style, label=f"{arm} (test MSE)")
    if coded:
        feature = np.mean([arms[a]["feature_erank"]["mean"] for a in coded])
        ax.axvline(feature, color="black", ls="-.", lw=0.8, label=f"held-out z_e erank (mean {feature:.1f})")
    ax.set_yscale("log")
    ax.set_xlabel("effective rank of the used codes (Roy-Vetterli)")
    ax.set_ylabel("test MSE per patch (mean)")
    ax.legend(fontsize=6, loc="lower right", bbox_to_anchor=(1.0, 0.1))
    return [save_figure(fig, out_dir / f"{result['mode']}_mse_vs_erank.png")]
