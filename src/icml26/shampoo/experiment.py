"""Reproduction of AdamW-style Shampoo: the theory's rate and nuclear-norm ratio, and steps to a target loss.

Two parts, on the same seeds:

1. **Rate (the paper's theorem).** Stochastic matrix least squares f(X) = 1/2 ||P (X - X*) Q||_F^2 (``data.py``),
   ill-conditioned on both sides (condition number ``rate_kappa`` = 1e3 of P^T P and of Q Q^T), with step size
   lr_K = c K^(-3/4) (the non-convex Adam/AdaGrad schedule that gives K^(-1/4); the paper's exact schedule is
   reconstructed). Arms: two-sided and left one-sided Shampoo (the paper's rule, no grafting), SGD with
   momentum and AdamW. For each horizon K the average over k < K of the *full* gradient's nuclear norm is
   recorded: its value at the largest K is compared across arms (the theorem's constant at fixed K), and the
   slope of log average against log K with the theorem's -1/4. The constant c is tuned per arm on a separate
   validation problem by the objective f(X_K), never on an evaluated seed and never by the gradient norms.
2. **Practice.** Digits MLP, digits CNN and a tiny transformer on sequence reversal: AdamW, SGD with momentum,
   two-sided and one-sided (left) Shampoo with Adam grafting, from the same initialisation and the same
   mini-batches. Steps until the full-data training loss falls below the target (checked every ``eval_every``
   steps; a run that never gets there counts as ``max_steps + eval_every``), and the final loss. Each arm's
   learning rate is chosen per task on the validation seeds ``lr_validation_seeds`` (their own data split,
   initialisation and mini-batches; never an evaluated seed) by the mean log steps to the target over those
   seeds (``choose_lr``), the grid grown by half-decades past an edge where the choice sits, so that the chosen
   value has a grid value on each side; the evaluated seed then trains once per arm at that lr. The choice
   does not depend on the evaluated seed: it is made once per run and shared by its seeds, and recorded as
   ``<task>_lr`` (with ``<task>_lr_at_grid_edge``, 1 when the grown grid still ends at it). On the MLP the
   full-data gradient of every weight matrix is recorded along training: its nuclear-to-Frobenius ratio, placed within the theory's range
   [1/sqrt(min(m, n)), 1] on a log scale (0 = rank one, the worst case; 1 = flat spectrum, the "ideal case"
   where the rate matches SGD's).

Example:
    >>> from icml26.shampoo.experiment import PRESETS, run
    >>> import dataclasses
    >>> cfg = dataclasses.replace(PRESETS["smoke"], tasks=("digits_mlp",), max_steps=20, rate_horizons=(20, 40))
    >>> sorted(run(cfg).metrics)[:3]
    ['adamw', 'rate_adamw', 'rate_sgd']
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..common.plotting import new_figure, save_figure
from ..common.progress import progress
from ..common.results import SeedRun
from .baselines import LR_GRIDS, make_optimizer
from .data import TASKS, MatrixLeastSquares, Task
from .optimizer import Shampoo

RATE_ARMS = ("shampoo_two_sided", "shampoo_left", "sgd", "adamw")
#: the card's claim about each practice task (notes on a run go to its claim)
PRACTICE_CLAIMS = {
    "digits_mlp": "practice_mlp",
    "digits_cnn": "practice_cnn",
    "reversal_transformer": "practice_transformer",
}


@dataclass
class Config:
    """Settings of one seed's run (``PRESETS`` holds smoke / quick / full)."""

    seed: int = 0
    """seed of the data split, the initialisation, the mini-batches and the least-squares problem"""
    tasks: tuple[str, ...] = ("digits_mlp", "digits_cnn", "reversal_transformer")
    """practice tasks (keys of ``data.TASKS``)"""
    arms: tuple[str, ...] = ("adamw", "sgd_momentum", "shampoo_two_sided", "shampoo_left")
    """practice optimizers (keys of ``baselines.FACTORIES``)"""
    lr_grid: bool = True
    """choose each arm's learning rate from its grid (``baselines.LR_GRIDS``) on ``lr_validation_seeds``; else
    use the grid's second value without tuning"""
    lr_validation_seeds: tuple[int, ...] = (2000, 2001)
    """the seeds whose runs choose the learning rates (two draws: one run's steps to the target are noisy);
    disjoint from every evaluated seed (quick 0-4, full 100-104), which ``run`` enforces"""
    max_steps: int = 100
    """training steps per practice run"""
    eval_every: int = 5
    """full-data loss checked every this many steps (the resolution of 'steps to target')"""
    batch_size: int = 128
    """mini-batch size of the practice tasks"""
    target_loss: float = 0.01
    """full-data training loss that counts as 'reached'"""
    ratio_task: str = "digits_mlp"
    """task whose full-data weight gradients are recorded for the nuclear/Frobenius ratio"""
    rate_arms: tuple[str, ...] = RATE_ARMS
    """optimizers of the rate experiment: Shampoo without grafting (the paper's rule), SGD with momentum, AdamW"""
    rate_horizons: tuple[int, ...] = (100, 300, 1000)
    """horizons K of the rate experiment"""
    rate_shape: tuple[int, int] = (16, 16)
    """(m, n) of the least-squares matrix parameter"""
    rate_kappa: float = 1e3
    """condition number of P^T P and of Q Q^T (each side of the problem; fixed before the v2 run, issue #21)"""
    rate_sigma: float = 0.05
    """per-entry standard deviation of the gradient noise (noise Frobenius norm 0.8 at 16 x 16, below the
    initial full gradient's, so the Kronecker factors see the curvature and not only isotropic noise)"""
    rate_constants: dict[str, tuple[float, ...]] = field(
        default_factory=lambda: {
            "shampoo_two_sided": (1.0, 3.0, 10.0, 30.0, 100.0),
            "shampoo_left": (1.0, 3.0, 10.0, 30.0, 100.0),
            "sgd": (0.3, 1.0, 3.0, 10.0, 30.0),
            "adamw": (0.3, 1.0, 3.0, 10.0, 30.0),
        }
    )
    """grid of c in lr_K = c K^(-3/4) per arm (five half-decade points), tuned per arm on the validation problem
    (seed ``RATE_VALIDATION_SEED``) by the problem's own objective f(X_K) at the largest K, never by the
    gradient norms"""
    threads: int = 1
    """torch intra-op threads"""


PRESETS: dict[str, Config] = {
    "smoke": Config(
        tasks=("digits_mlp",),
        arms=("adamw", "shampoo_two_sided", "shampoo_left"),
        lr_grid=False,
        max_steps=40,
        eval_every=10,
        rate_horizons=(30, 60, 120),
        rate_constants={
            "shampoo_two_sided": (10.0,),
            "shampoo_left": (10.0,),
            "sgd": (3.0,),
            "adamw": (3.0,),
        },
    ),
    # five seeds within the 2-minute budget: the digits MLP only (the CNN and transformer tasks run in full),
    # and SGD with momentum (no practice claim names it) only in full (README, Deviations)
    "quick": Config(tasks=("digits_mlp",), arms=("adamw", "shampoo_two_sided", "shampoo_left")),
    "full": Config(
        arms=("adamw", "sgd_momentum", "shampoo_two_sided", "shampoo_left", "shampoo_two_sided_nograft"),
        max_steps=300,
        rate_horizons=(100, 300, 1000, 3000),
    ),
}


# ----------------------------------------------------------------------------------------------- practice part
@dataclass
class TrainRun:
    """One optimizer at one learning rate on one task."""

    lr: float
    steps_to_target: int | None
    final_loss: float
    ms_per_step: float
    curve: tuple[list[int], list[float], list[float]]
    """(step, full-data loss, training seconds so far) at every evaluation"""
    ratio_positions: list[float] = field(default_factory=list)
    """per weight matrix: position of its nuclear/Frobenius ratio within the theory's range"""
    ratios: list[float] = field(default_factory=list)
    diverged: bool = False


def ratio_position(nuclear: float, frobenius: float, min_dim: int) -> tuple[float, float]:
    """``(r, position)``: r = ||G||_* / (sqrt(min) ||G||_F) in [1/sqrt(min), 1], and its log-scale position in
    that range, 0 at the rank-one end, 1 at the flat-spectrum end.

    Example:
        >>> ratio_position(2.0, 1.0, 4)   # ||G||_* = 2 ||G||_F with min(m, n) = 4: a flat spectrum
        (1.0, 1.0)
    """
    if min_dim < 2:
        raise ValueError(f"min_dim must be >= 2, got {min_dim}")
    r = nuclear / (math.sqrt(min_dim) * frobenius)
    # $$\|G\|_F \le \|G\|_* \le \sqrt{\min(m,n)}\,\|G\|_F$$   (the paper's norm relation, v4)
    return r, 1.0 + math.log(r) / math.log(math.sqrt(min_dim))


def _weight_matrices(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.ndim >= 2 and min(p.shape[0], math.prod(p.shape[1:])) >= 2]


def train(task: Task, arm: str, lr: float, cfg: Config, *, track_ratio: bool = False) -> TrainRun:
    """Train ``task``'s model with ``arm`` at ``lr`` for ``cfg.max_steps`` mini-batch steps."""
    model = task.make_model(cfg.seed)
    opt = make_optimizer(arm, model.parameters(), lr)
    batches = torch.Generator().manual_seed(cfg.seed)
    n = task.X.shape[0]
    mats = _weight_matrices(model) if track_ratio else []
    nuc_sum, fro_sum = [0.0] * len(mats), [0.0] * len(mats)
    steps_seen, losses, times = [], [], []
    reached: int | None = None
    train_s = 0.0
    completed = 0
    diverged = False
    for step in range(1, cfg.max_steps + 1):
        idx = torch.randint(0, n, (cfg.batch_size,), generator=batches)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = task.loss_fn(model(task.X[idx]), task.y[idx])
        if not torch.isfinite(loss):
            diverged = True
            break
        loss.backward()
        try:
            opt.step()
        except ValueError:  # Shampoo refuses non-finite gradients instead of corrupting its state
            diverged = True
            break
        train_s += time.perf_counter() - t0
        completed = step
        if step % cfg.eval_every == 0:
            if track_ratio:
                model.zero_grad(set_to_none=True)
                full = task.loss_fn(model(task.X), task.y)
                full.backward()
                for i, p in enumerate(mats):
                    g = p.grad.reshape(p.shape[0], -1).double()
                    nuc_sum[i] += float(torch.linalg.matrix_norm(g, "nuc"))
                    fro_sum[i] += float(torch.linalg.matrix_norm(g))
                full_loss = float(full.detach())
            else:
                full_loss = task.full_loss(model)
            if not math.isfinite(full_loss):
                diverged = True
                break
            steps_seen.append(step)
            losses.append(full_loss)
            times.append(train_s)
            if reached is None and full_loss < cfg.target_loss:
                reached = step
    final = float("nan") if diverged else task.full_loss(model)
    ratios, positions = [], []
    for p, nuc, fro in zip(mats, nuc_sum, fro_sum, strict=True):
        if fro > 0:
            r, pos = ratio_position(nuc, fro, min(p.shape[0], math.prod(p.shape[1:])))
            ratios.append(r)
            positions.append(pos)
    return TrainRun(
        lr,
        reached,
        final,
        1e3 * train_s / max(1, completed),
        (steps_seen, losses, times),
        positions,
        ratios,
        diverged,
    )


#: half-decade steps the learning-rate grid may grow past an edge where the validation choice sits, per side
LR_GRID_EXTENSIONS = 2


@dataclass(frozen=True)
class LRChoice:
    """One arm's learning rate on one task, chosen on the validation seeds."""

    lr: float
    grid: tuple[float, ...]
    """every lr tried, ascending (the base grid and its extensions)"""
    scores: tuple[tuple[float, float], ...]
    """per grid value: (mean log steps to the target, mean final loss) over the validation seeds"""
    seeds: tuple[int, ...]
    """the validation seeds"""

    @property
    def at_edge(self) -> bool:
        """The chosen lr is the smallest or largest tried (no grid value on one side)."""
        return len(self.grid) > 1 and self.lr in (self.grid[0], self.grid[-1])


def _half_decade(lr: float, up: bool) -> float:
    """The next value of the 1-3-10 ladder above (``up``) or below ``lr``: 3e-2 -> 1e-1 or 1e-2."""
    k = math.floor(math.log10(lr) + 1e-9)
    ladder = [float(f"{m}e{e}") for e in (k - 1, k, k + 1) for m in (1, 3)]
    if up:
        return min(v for v in ladder if v > lr * (1 + 1e-9))
    return max(v for v in ladder if v < lr * (1 - 1e-9))


_LR_CHOICES: dict[tuple[Any, ...], LRChoice] = {}


def choose_lr(task_name: str, arm: str, cfg: Config) -> LRChoice:
    """``arm``'s learning rate on ``task_name``: the grid value with the lowest mean log steps to the target over
    ``cfg.lr_validation_seeds`` (ties: lower mean final loss), each seed its own data split, initialisation and
    mini-batches; the grid grows by a half-decade past an edge where the choice sits (at most
    ``LR_GRID_EXTENSIONS`` per side). Only the validation seeds train here, never ``cfg.seed``; cached, so the
    seeds of one run share one choice."""
    seeds = tuple(cfg.lr_validation_seeds)
    if not seeds:
        raise ValueError("lr_validation_seeds must be non-empty")
    key = (
        task_name,
        arm,
        LR_GRIDS[arm],
        seeds,
        cfg.max_steps,
        cfg.eval_every,
        cfg.batch_size,
        cfg.target_loss,
    )
    if key in _LR_CHOICES:
        return _LR_CHOICES[key]
    censored = cfg.max_steps + cfg.eval_every
    tasks = {s: TASKS[task_name](s) for s in seeds}
    scores: dict[float, tuple[float, float]] = {}

    def score(lr: float) -> tuple[float, float]:
        if lr not in scores:
            runs = [train(tasks[s], arm, lr, dataclasses.replace(cfg, seed=s)) for s in seeds]
            log_steps = float(np.mean([math.log(r.steps_to_target or censored) for r in runs]))
            finals = [r.final_loss if math.isfinite(r.final_loss) else math.inf for r in runs]
            scores[lr] = (log_steps, float(np.mean(finals)))
        return scores[lr]

    grid = sorted(LR_GRIDS[arm])
    grown = {"down": 0, "up": 0}
    while True:
        best = min(grid, key=score)
        if len(grid) < 2:
            break
        side = "down" if best == grid[0] else "up" if best == grid[-1] else None
        if side is None or grown[side] >= LR_GRID_EXTENSIONS:
            break
        grown[side] += 1
        grid = sorted([*grid, _half_decade(best, up=side == "up")])
    choice = LRChoice(best, tuple(grid), tuple(scores[lr] for lr in grid), seeds)
    _LR_CHOICES[key] = choice
    return choice


# ---------------------------------------------------------------------------------------------------- rate part
def _rate_optimizer(arm: str, X: torch.nn.Parameter, lr: float) -> torch.optim.Optimizer:
    if arm == "sgd":
        return torch.optim.SGD([X], lr=lr, momentum=0.9)
    if arm == "adamw":
        return torch.optim.AdamW([X], lr=lr, weight_decay=0.0)
    exponents = {"shampoo_two_sided": "two_sided", "shampoo_left": "left", "shampoo_right": "right"}[arm]
    # the paper's rule: no grafting, roots every step, float64 factors
    return Shampoo(
        [X],
        lr=lr,
        exponents=exponents,
        grafting="none",
        precondition_frequency=1,
        start_preconditioning_step=1,
        factor_dtype=torch.float64,
    )


def average_gradient_norms(
    arm: str,
    horizon: int,
    c: float,
    problem_seed: int,
    shape: tuple[int, int],
    kappa: float = 10.0,
    sigma: float = 0.5,
) -> tuple[float, float, float]:
    """Run ``horizon`` steps with lr = c K^(-3/4) on ``MatrixLeastSquares(*shape, problem_seed, kappa, sigma)``.

    Returns:
        The averages over k < K of ||grad f(X_k)||_* and ||grad f(X_k)||_F (full gradients), and f(X_K).
    """
    problem = MatrixLeastSquares(*shape, seed=problem_seed, kappa=kappa, sigma=sigma)
    X = torch.nn.Parameter(torch.zeros(shape, dtype=torch.float64))
    opt = _rate_optimizer(arm, X, c * horizon**-0.75)
    nuc = fro = 0.0
    for _ in range(horizon):
        full = problem.full_grad(X.detach())
        # $$\frac{1}{K} \sum_{k=1}^{K} \|\nabla f(X_k)\|_*$$   (the theorem's left-hand side, full gradient)
        nuc += float(torch.linalg.matrix_norm(full, "nuc"))
        fro += float(torch.linalg.matrix_norm(full))
        X.grad = problem.stochastic_grad(X.detach())
        opt.step()
    return nuc / horizon, fro / horizon, problem.loss(X.detach())


#: the validation problem's seed: every evaluated seed's c is tuned on this one problem (never on seeds 0-4)
RATE_VALIDATION_SEED = 1000


@functools.lru_cache(maxsize=64)
def tune_rate_constant(
    arm: str, horizon: int, constants: tuple[float, ...], shape: tuple[int, int], kappa: float, sigma: float
) -> float:
    """The c of ``constants`` with the lowest objective f(X_K) at ``horizon`` on the validation problem.

    The problem's own objective, what a user would tune on, and not the claim's metric (the gradient norms);
    cached, so the seeds of one run share one tuning (it does not depend on the evaluated seed).
    """
    return min(
        constants,
        key=lambda c: average_gradient_norms(arm, horizon, c, RATE_VALIDATION_SEED, shape, kappa, sigma)[2],
    )


def loglog_slope(horizons: tuple[int, ...], values: list[float]) -> float:
    """Least-squares slope of log(values) against log(horizons)."""
    return float(np.polyfit(np.log(horizons), np.log(values), 1)[0])


# ---------------------------------------------------------------------------------------------------------- run
def run(cfg: Config) -> SeedRun:
    """One seed of the reproduction; metrics per arm as named in the card's checks."""
    if cfg.lr_grid and cfg.seed in cfg.lr_validation_seeds:
        raise ValueError(
            f"seed {cfg.seed} is a learning-rate validation seed {cfg.lr_validation_seeds}: the "
            "evaluated seeds must be disjoint from them"
        )
    metrics: dict[str, dict[str, float]] = {arm: {} for arm in cfg.arms}
    curves: dict[str, dict[str, Any]] = {}
    notes: dict[str, str] = {}
    censored = cfg.max_steps + cfg.eval_every
    # each arm's lr, chosen on the validation seeds before the evaluated seed trains at all
    choices: dict[tuple[str, str], LRChoice] = {}
    for task_name in cfg.tasks:
        for arm in cfg.arms:
            if cfg.lr_grid:
                choices[task_name, arm] = choose_lr(task_name, arm, cfg)
            else:
                lr = LR_GRIDS[arm][1]
                choices[task_name, arm] = LRChoice(lr, (lr,), (), ())
    results: dict[tuple[str, str], TrainRun] = {}
    unreached: dict[str, list[str]] = {}
    edge: dict[str, list[str]] = {}
    tasks = {name: TASKS[name](cfg.seed) for name in cfg.tasks}
    for (task_name, arm), choice in progress(list(choices.items()), desc=f"shampoo practice seed {cfg.seed}"):
        results[task_name, arm] = train(
            tasks[task_name], arm, choice.lr, cfg, track_ratio=task_name == cfg.ratio_task
        )
    for (task_name, arm), best in results.items():
        choice = choices[task_name, arm]
        metrics[arm][f"{task_name}_steps"] = float(best.steps_to_target or censored)
        metrics[arm][f"{task_name}_final_loss"] = best.final_loss
        metrics[arm][f"{task_name}_ms_per_step"] = best.ms_per_step
        metrics[arm][f"{task_name}_lr"] = choice.lr
        metrics[arm][f"{task_name}_lr_at_grid_edge"] = float(choice.at_edge)
        if choice.at_edge:
            edge.setdefault(task_name, []).append(arm)
        if task_name == cfg.ratio_task:
            metrics[arm]["nuclear_ratio"] = float(np.mean(best.ratios)) if best.ratios else float("nan")
            metrics[arm]["nuclear_ratio_position"] = (
                float(np.mean(best.ratio_positions)) if best.ratio_positions else float("nan")
            )
        if best.steps_to_target is None:
            unreached.setdefault(task_name, []).append(arm)
        curves.setdefault(task_name, {})[arm] = {"lr": best.lr, "curve": best.curve}
    lr_choice = {
        task_name: {
            arm: {
                "lr": c.lr,
                "grid": list(c.grid),
                "scores": [list(x) for x in c.scores],
                "seeds": list(c.seeds),
            }
            for (t, arm), c in choices.items()
            if t == task_name
        }
        for task_name in cfg.tasks
    }

    for task_name in set(unreached) | set(edge):
        parts = []
        if task_name in unreached:
            parts.append(
                f"{', '.join(unreached[task_name])} did not reach loss {cfg.target_loss} within {cfg.max_steps} "
                f"steps at the lr chosen on the validation seeds (counted as {censored} steps)"
            )
        if task_name in edge:
            parts.append(
                f"the lr of {', '.join(edge[task_name])} sits at an end of its grid after "
                f"{LR_GRID_EXTENSIONS} half-decade extensions"
            )
        notes[PRACTICE_CLAIMS[task_name]] = "; ".join(parts)

    rate: dict[str, dict[str, Any]] = {}
    for arm in progress(cfg.rate_arms, desc=f"shampoo rate seed {cfg.seed}"):
        k_max = max(cfg.rate_horizons)
        constants = cfg.rate_constants[arm]
        problem = dict(shape=cfg.rate_shape, kappa=cfg.rate_kappa, sigma=cfg.rate_sigma)
        tuned = tune_rate_constant(
            arm, k_max, tuple(constants), cfg.rate_shape, cfg.rate_kappa, cfg.rate_sigma
        )
        runs_k = [average_gradient_norms(arm, k, tuned, cfg.seed, **problem) for k in cfg.rate_horizons]
        nucs, fros, losses = (list(v) for v in zip(*runs_k, strict=True))
        m = min(cfg.rate_shape)
        metrics[f"rate_{arm}"] = {
            "slope": loglog_slope(cfg.rate_horizons, nucs),
            "slope_frobenius": loglog_slope(cfg.rate_horizons, fros),
            "c": tuned,
            "c_at_grid_edge": float(len(constants) > 1 and tuned in (constants[0], constants[-1])),
            "avg_nuclear_at_kmax": nucs[-1],
            "avg_frobenius_at_kmax": fros[-1],
            "final_loss_at_kmax": losses[-1],
            "nuclear_ratio": nucs[-1] / (math.sqrt(m) * fros[-1]),
        }
        rate[arm] = {"horizons": list(cfg.rate_horizons), "nuclear": list(nucs), "frobenius": list(fros)}
    return SeedRun(metrics, series={"curves": curves, "rate": rate, "lr_choice": lr_choice}, notes=notes)


def plot(runs: list[SeedRun], result: dict[str, Any], out_dir: Path) -> list[Path]:
    """Loss against steps and against wall time (first seed, best lr per arm), and the rate on log-log axes."""
    mode = result["mode"]
    written: list[Path] = []
    curves = runs[0].series["curves"]
    if curves:
        fig, axes = new_figure(2, len(curves), squeeze=False)
        for j, (task_name, arms) in enumerate(curves.items()):
            for arm, entry in arms.items():
                steps, losses, times = entry["curve"]
                label = f"{arm} (lr {entry['lr']:g})"
                axes[0][j].semilogy(steps, losses, label=label)
                axes[1][j].semilogy(times, losses, label=label)
            axes[0][j].set_title(f"{task_name}, seed {result['seeds'][0]}")
            axes[0][j].set_xlabel("step")
            axes[1][j].set_xlabel("training seconds")
            for ax in (axes[0][j], axes[1][j]):
                ax.axhline(result["config"]["target_loss"], color="grey", lw=0.8, ls=":")
                ax.set_ylabel("full-data training loss")
        axes[0][0].legend(fontsize=7)
        written.append(save_figure(fig, out_dir / f"{mode}_loss_curves.png"))
    fig, ax = new_figure()
    for arm in runs[0].series["rate"]:
        horizons = runs[0].series["rate"][arm]["horizons"]
        mean = np.mean([r.series["rate"][arm]["nuclear"] for r in runs], axis=0)
        ax.loglog(horizons, mean, marker="o", label=arm)
    h = np.array(horizons, dtype=float)
    ax.loglog(h, mean[0] * (h / h[0]) ** -0.25, ls="--", color="grey", label="slope -1/4 (theorem)")
    ax.set_xlabel("K")
    ax.set_ylabel("(1/K) sum ||grad f(X_k)||_*")
    ax.legend(fontsize=7)
    written.append(save_figure(fig, out_dir / f"{mode}_rate.png"))
    return written
