"""Reproduction of dimensional collapse in VQ codebooks and of the codebook regulariser, on digits.

An MLP VQ-VAE (64 -> 256 -> 4 positions x D -> quantiser -> 256 -> 64) reconstructs sklearn's 8x8 digits
(pixels / 16); every arm trains the same architecture from the same initialisation on the same batches:

- ``vq`` (learnable codebook), ``vq_cr`` (+ the regulariser, official default lambda = 1e-3);
- ``simvq`` (frozen Gaussian basis + learnable projection), ``simvq_cr`` (+ regulariser, 1e-3),
  ``simvq_cr_strong`` (1e-2, the sweep);
- ``ae_warmup`` (the "continuous first, discrete later" baseline: the first third of training without
  quantisation, then a codebook initialised from encoder outputs);
- ``vq_orth`` (vector-quantize-pytorch's ``orthogonal_reg_weight``, the library's code-orthogonality penalty);
- ``fsq`` (finite scalar quantisation at equal bits: levels 4^4 = 256 codes).

Metrics on the held-out split: reconstruction MSE and PSNR, codes used, effective rank (Roy-Vetterli, centred,
singular values) of all codes, of the used codes and of the held-out encoder outputs z_e, their ratio, the NLL
(bits per code) of a small autoregressive prior over each image's 4 codes, and a linear probe of the digit
class on the quantised latents. The full preset adds the regime search the design notes list (bigger codebook
and width with longer training, a small lambda switched on late, cosine codebooks).

Example:
    >>> import dataclasses
    >>> from icml26.vq_rank.experiment import PRESETS, run
    >>> cfg = dataclasses.replace(PRESETS["smoke"], steps=30, arms=("simvq", "simvq_cr"), prior_steps=10)
    >>> out = run(cfg)
    >>> sorted(out.metrics["simvq_cr"])[:3], len(out.units["images"]["simvq_cr"]["test_mse"]) > 300
    (['codebook_erank', 'erank_ratio', 'feature_erank'], True)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..common.datasets import digits
from ..common.optional import requires
from ..common.plotting import new_figure, save_figure
from ..common.progress import progress
from ..common.results import SeedRun
from .module import (
    CodebookRegularizer,
    SimVQQuantizer,
    VectorQuantizer,
    codebook_tensor,
    effective_rank,
)

ARMS = ("vq", "vq_cr", "simvq", "simvq_cr", "simvq_cr_strong", "ae_warmup", "vq_orth", "fsq")
#: arms whose per-image test MSE is recorded (the arms the card's fidelity claims compare)
UNIT_ARMS = ("simvq", "simvq_cr")


@dataclass
class Config:
    """Settings of one seed's run (``PRESETS`` holds smoke / quick / full)."""

    seed: int = 0
    """seed of the split, the initialisation and the batches"""
    arms: tuple[str, ...] = ARMS
    """arms to train (see the module docstring)"""
    steps: int = 600
    """training steps per arm"""
    batch_size: int = 128
    """mini-batch size"""
    lr: float = 2e-3
    """Adam learning rate"""
    codebook_size: int = 256
    """K"""
    dim: int = 32
    """D, the code dimension"""
    positions: int = 4
    """latent positions per image (codes per image)"""
    hidden: int = 256
    """width of the encoder and decoder MLPs"""
    beta: float = 0.25
    """commitment weight of the legacy VQ loss"""
    reg_weight: float = 1e-3
    """lambda of the codebook regulariser (official default; "robust in [1e-3, 1e-1]")"""
    strong_reg_weight: float = 1e-2
    """lambda of ``simvq_cr_strong``"""
    warmup_fraction: float = 1 / 3
    """share of the steps ``ae_warmup`` trains without quantisation"""
    orth_weight: float = 10.0
    """vector-quantize-pytorch's orthogonal_reg_weight for ``vq_orth``"""
    prior_steps: int = 300
    """training steps of the autoregressive prior over codes"""
    regimes: tuple[str, ...] = ()
    """the fidelity regime search (full preset): 'large', 'late_small_lambda', 'cosine'"""
    threads: int = 1
    """torch intra-op threads"""


PRESETS: dict[str, Config] = {
    "smoke": Config(steps=120, arms=("vq", "simvq", "simvq_cr", "fsq"), prior_steps=50),
    "quick": Config(),
    "full": Config(steps=2000, regimes=("large", "late_small_lambda", "cosine")),
}


class FSQAdapter(nn.Module):
    """vector-quantize-pytorch's FSQ with the (quantized, indices, loss) interface and an implicit codebook."""

    def __init__(self, levels: tuple[int, ...], dim: int):
        super().__init__()
        fsq = requires("vector_quantize_pytorch", extra="audio", purpose="the FSQ baseline").FSQ
        self.fsq = fsq(levels=list(levels), dim=dim)
        self.codebook_size = math.prod(levels)

    @property
    def codebook(self) -> Tensor:
        return self.fsq.indices_to_codes(torch.arange(self.codebook_size))

    def forward(self, z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        quantized, indices = self.fsq(z)
        return quantized, indices, z.new_zeros(())


class LucidrainsVQ(nn.Module):
    """vector-quantize-pytorch's VectorQuantize with a learnable codebook and its orthogonal regulariser."""

    def __init__(self, codebook_size: int, dim: int, orth_weight: float):
        super().__init__()
        vq = requires("vector_quantize_pytorch", extra="audio", purpose="the orthogonal-regulariser baseline")
        self.vq = vq.VectorQuantize(dim=dim, codebook_size=codebook_size, learnable_codebook=True,
                                    ema_update=False, orthogonal_reg_weight=orth_weight, commitment_weight=1.0)

    @property
    def codebook(self) -> Tensor:
        return self.vq.codebook

    def forward(self, z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self.vq(z)


class VQVAE(nn.Module):
    """MLP encoder -> (positions x dim) -> quantiser -> MLP decoder."""

    def __init__(self, quantizer: nn.Module, cfg: Config, in_dim: int = 64):
        super().__init__()
        self.positions, self.dim = cfg.positions, cfg.dim
        self.encoder = nn.Sequential(nn.Linear(in_dim, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, cfg.positions * cfg.dim))
        self.decoder = nn.Sequential(nn.Linear(cfg.positions * cfg.dim, cfg.hidden), nn.ReLU(),
                                     nn.Linear(cfg.hidden, in_dim))
        self.quantizer = quantizer
        self.bypass = False  # AE warm-up: skip quantisation

    def encode(self, x: Tensor) -> Tensor:
        return self.encoder(x).reshape(-1, self.positions, self.dim)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        z = self.encode(x)
        if self.bypass:
            q, idx, loss = z, torch.zeros(z.shape[:2], dtype=torch.long), z.new_zeros(())
        else:
            q, idx, loss = self.quantizer(z)
        return self.decoder(q.reshape(x.shape[0], -1)), z, idx, loss


def make_quantizer(arm: str, cfg: Config) -> nn.Module:
    K, D = cfg.codebook_size, cfg.dim
    if arm in ("vq", "ae_warmup"):
        return VectorQuantizer(K, D, beta=cfg.beta)
    if arm == "vq_cr":
        return CodebookRegularizer(VectorQuantizer(K, D, beta=cfg.beta), weight=cfg.reg_weight)
    if arm == "simvq":
        return SimVQQuantizer(K, D, beta=cfg.beta)
    if arm == "simvq_cr":
        return CodebookRegularizer(SimVQQuantizer(K, D, beta=cfg.beta), weight=cfg.reg_weight)
    if arm == "simvq_cr_strong":
        return CodebookRegularizer(SimVQQuantizer(K, D, beta=cfg.beta), weight=cfg.strong_reg_weight)
    if arm == "vq_orth":
        return LucidrainsVQ(K, D, cfg.orth_weight)
    if arm == "fsq":
        levels = (4,) * round(math.log(K, 4))
        if math.prod(levels) != K:
            raise ValueError(f"fsq needs codebook_size to be a power of 4 for equal bits, got {K}")
        return FSQAdapter(levels, D)
    raise ValueError(f"unknown arm {arm!r}; arms are {ARMS}")


def _codebook(model: VQVAE) -> Tensor:
    q = model.quantizer.quantizer if isinstance(model.quantizer, CodebookRegularizer) else model.quantizer
    return codebook_tensor(q).detach()


def train_vqvae(arm: str, cfg: Config, X: Tensor, *, regime_hook: Any = None) -> VQVAE:
    """Train one arm's VQ-VAE on ``X`` (rows in [0, 1])."""
    torch.manual_seed(cfg.seed)
    model = VQVAE(make_quantizer(arm, cfg), cfg)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    batches = torch.Generator().manual_seed(cfg.seed)
    warm = int(cfg.warmup_fraction * cfg.steps) if arm == "ae_warmup" else 0
    model.bypass = warm > 0
    for step in range(cfg.steps):
        if step == warm and warm > 0:
            model.bypass = False
            with torch.no_grad():  # initialise the codebook from encoder outputs (data-dependent init)
                z = model.encode(X).reshape(-1, cfg.dim)
                pick = torch.randperm(z.shape[0], generator=batches)[: cfg.codebook_size]
                model.quantizer.embed.copy_(z[pick])
        if regime_hook is not None:
            regime_hook(model, step)
        idx = torch.randint(0, X.shape[0], (cfg.batch_size,), generator=batches)
        x = X[idx]
        recon, _, _, qloss = model(x)
        loss = nn.functional.mse_loss(recon, x) + qloss
        if not torch.isfinite(loss):
            raise FloatingPointError(f"{arm}: the loss became {float(loss)} at step {step}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return model.eval()


def prior_nll_bits(codes_train: np.ndarray, codes_test: np.ndarray, K: int, steps: int, seed: int) -> float:
    """Bits per code of a small autoregressive prior p(c_1) prod_p p(c_p | c_<p), trained on the train codes."""
    P = codes_train.shape[1]
    torch.manual_seed(seed)
    emb = nn.Embedding(K, 32)
    heads = nn.ModuleList([nn.Sequential(nn.Linear(32 * max(p, 1), 128), nn.ReLU(), nn.Linear(128, K))
                           for p in range(P)])
    first = nn.Parameter(torch.zeros(K))
    params = [*emb.parameters(), *heads.parameters(), first]
    opt = torch.optim.Adam(params, lr=3e-3)
    tr, te = torch.from_numpy(codes_train).long(), torch.from_numpy(codes_test).long()
    g = torch.Generator().manual_seed(seed)

    def nll(c: Tensor) -> Tensor:
        total = nn.functional.cross_entropy(first.expand(c.shape[0], K), c[:, 0])
        for p in range(1, P):
            context = emb(c[:, :p]).reshape(c.shape[0], -1)
            total = total + nn.functional.cross_entropy(heads[p](context), c[:, p])
        return total / P

    for _ in range(steps):
        batch = tr[torch.randint(0, tr.shape[0], (128,), generator=g)]
        opt.zero_grad()
        nll(batch).backward()
        opt.step()
    with torch.no_grad():
        return float(nll(te)) / math.log(2)


def per_image_mse(model: VQVAE, X: Tensor) -> np.ndarray:
    """Each image's reconstruction MSE (mean over its pixels, float64); their mean is the test MSE."""
    with torch.no_grad():
        rec = model(X)[0]
    return ((rec.double() - X.double()) ** 2).mean(dim=1).numpy()


def evaluate(model: VQVAE, cfg: Config, X_tr: Tensor, X_te: Tensor, y_tr: np.ndarray, y_te: np.ndarray
             ) -> tuple[dict[str, float], np.ndarray]:
    """``(metrics, per-image test MSE)`` of a trained arm on the held-out split."""
    from sklearn.linear_model import LogisticRegression

    with torch.no_grad():
        _, z_te, idx_te, _ = model(X_te)
        _, _, idx_tr, _ = model(X_tr)
        q_tr, _, _ = model.quantizer(model.encode(X_tr))
        q_te, _, _ = model.quantizer(z_te)
    per_image = per_image_mse(model, X_te)
    mse = math.fsum(per_image.tolist()) / len(per_image)
    codebook = _codebook(model)
    used = torch.unique(idx_tr)
    used_erank = effective_rank(codebook[used]) if used.numel() >= 2 else 0.0
    feature_erank = effective_rank(z_te.reshape(-1, cfg.dim))
    probe = LogisticRegression(max_iter=2000).fit(q_tr.reshape(len(y_tr), -1).numpy(), y_tr)
    return {
        "test_mse": mse,
        # $$\mathrm{PSNR} = 10 \log_{10}(1 / \mathrm{MSE})$$   (pixels in [0, 1])
        "psnr": 10 * math.log10(1.0 / mse),
        "used_codes": float(used.numel()),
        "codebook_erank": effective_rank(codebook),
        "used_erank": used_erank,
        "feature_erank": feature_erank,
        "erank_ratio": used_erank / feature_erank if feature_erank > 0 else float("nan"),
        "prior_nll_bits": prior_nll_bits(idx_tr.numpy(), idx_te.numpy(), codebook.shape[0], cfg.prior_steps,
                                         cfg.seed),
        "probe_accuracy": float(probe.score(q_te.reshape(len(y_te), -1).numpy(), y_te)),
    }, per_image


REGIMES: dict[str, dict[str, Any]] = {
    # bigger codebook and width, longer training
    "large": {"codebook_size": 1024, "dim": 64, "steps_factor": 1.5},
    # a small lambda, switched on only after half of training (once utilisation has saturated)
    "late_small_lambda": {"reg_weight": 1e-4, "reg_start": 0.5},
    # cosine codebooks: codes and encoder outputs L2-normalised before the nearest-neighbour search
    "cosine": {"cosine": True},
}


class _CosineSimVQ(SimVQQuantizer):
    def effective_codebook(self) -> Tensor:
        return nn.functional.normalize(super().effective_codebook(), dim=1)

    def forward(self, z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return super().forward(nn.functional.normalize(z, dim=-1))


def regime_pair(name: str, cfg: Config, X_tr: Tensor, X_te: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Per-image test MSE of SimVQ without and with the regulariser in regime ``name`` (same images, same order)."""
    spec = REGIMES[name]
    base = dataclasses.replace(cfg, codebook_size=spec.get("codebook_size", cfg.codebook_size),
                               dim=spec.get("dim", cfg.dim), steps=int(cfg.steps * spec.get("steps_factor", 1)),
                               reg_weight=spec.get("reg_weight", cfg.reg_weight))
    mses = []
    for regularised in (False, True):
        torch.manual_seed(base.seed)
        inner = (_CosineSimVQ if spec.get("cosine") else SimVQQuantizer)(base.codebook_size, base.dim, beta=base.beta)
        weight = base.reg_weight if regularised else 0.0
        quantizer = CodebookRegularizer(inner, weight=weight)
        start = int(spec.get("reg_start", 0.0) * base.steps)

        def hook(model: VQVAE, step: int, q: CodebookRegularizer = quantizer, w: float = weight,
                 s: int = start) -> None:
            q.weight = w if step >= s else 0.0

        model = train_vqvae_with(quantizer, base, X_tr, hook)
        mses.append(per_image_mse(model, X_te))
    return mses[0], mses[1]


def train_vqvae_with(quantizer: nn.Module, cfg: Config, X: Tensor, hook: Any) -> VQVAE:
    """``train_vqvae`` for a ready-made quantiser (the regime search)."""
    torch.manual_seed(cfg.seed)
    model = VQVAE(quantizer, cfg)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    batches = torch.Generator().manual_seed(cfg.seed)
    for step in range(cfg.steps):
        hook(model, step)
        x = X[torch.randint(0, X.shape[0], (cfg.batch_size,), generator=batches)]
        recon, _, _, qloss = model(x)
        loss = nn.functional.mse_loss(recon, x) + qloss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return model.eval()


def run(cfg: Config) -> SeedRun:
    """One seed: train and evaluate every arm (and the regime search in full mode)."""
    split = digits(seed=cfg.seed, standardize=False)
    X_tr = torch.from_numpy(split.X_train) / 16.0
    X_te = torch.from_numpy(split.X_test) / 16.0
    metrics: dict[str, dict[str, float]] = {}
    images: dict[str, dict[str, list[float]]] = {}
    curves: dict[str, Any] = {}
    for arm in progress(cfg.arms, desc=f"vq_rank seed {cfg.seed}"):
        model = train_vqvae(arm, cfg, X_tr)
        metrics[arm], per_image = evaluate(model, cfg, X_tr, X_te, split.y_train, split.y_test)
        curves[arm] = {"erank": metrics[arm]["used_erank"], "mse": metrics[arm]["test_mse"]}
        if arm in UNIT_ARMS:
            images[arm] = {"test_mse": per_image.tolist()}
            del metrics[arm]["test_mse"]  # the mean of its images, filled in by SeedRun
    for name in cfg.regimes:
        plain, regularised = regime_pair(name, cfg, X_tr, X_te)
        images[f"regime_{name}"] = {"test_mse": plain.tolist()}
        images[f"regime_{name}_cr"] = {"test_mse": regularised.tolist()}
    return SeedRun(metrics, series={"points": curves}, units={"images": images} if images else {})


def plot(runs: list[SeedRun], result: dict[str, Any], out_dir: Path) -> list[Path]:
    """Test MSE against the used codes' effective rank per arm (mean over seeds), z_e's rank as a line."""
    fig, ax = new_figure()
    arms = result["arms"]
    for arm in runs[0].series["points"]:
        x, y = arms[arm]["used_erank"]["mean"], arms[arm]["test_mse"]["mean"]
        ax.scatter([x], [y], s=30)
        ax.annotate(arm, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    feature = np.mean([arms[a]["feature_erank"]["mean"] for a in runs[0].series["points"]])
    ax.axvline(feature, color="grey", ls=":", label=f"held-out z_e erank (mean {feature:.1f})")
    ax.set_xlabel("effective rank of the used codes (Roy-Vetterli)")
    ax.set_ylabel("test MSE")
    ax.legend(fontsize=7)
    return [save_figure(fig, out_dir / f"{result['mode']}_mse_vs_erank.png")]
