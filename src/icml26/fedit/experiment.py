"""Reproduction of the federated independence test: level under heterogeneity, power, privacy.

Each seed runs independent replications of every scenario (``data.py``) and every method on the same data:
the proposed test (copula + stacking, gamma null), its permutation-null version, the baselines
(``baselines.py``: pooled raw HSIC, pooled global ranks, copula + pooled, Fisher, Stouffer, stacked without
alignment) and the private test at epsilon in ``dp_epsilons``. Each replication's rejection at alpha = 0.05 is
recorded (1 or 0) as a unit ``replications``, in the same order for every method, so that methods pair by
replication (the same data went to each); the metric is the rejection rate:

- ``type1_shifts`` / ``type1_monotone`` / ``type1_real`` on data independent within every client (shared
  location-scale shifts; non-linear monotone marginal maps with unequal client sizes; diabetes split by age
  with Y permuted within clients);
- ``power_sine`` (shared shifts + sine dependence), ``power_flip`` (dependence whose sign flips across
  clients), ``power_monotone``, ``power_real`` (bmi against progression in the diabetes clients);
- the permutation null (``fedit_perm``) on its own shared-shifts replications;
- the private arms on larger clients (n = ``dp_n``, random features): ``type1_error`` and ``power``, with
  ``fedit_large`` the same test without privacy, every arm on the same clients in each replication.

The card's checks pool the replications of all seeds (a type-I error claim is a Clopper-Pearson bound on the
rejections of one scenario; a power comparison is the Agresti–Min interval for matched pairs over paired replications).

Example:
    >>> import dataclasses
    >>> from icml26.fedit.experiment import PRESETS, run
    >>> cfg = dataclasses.replace(PRESETS["smoke"], h0_reps=3, h1_reps=2, perm_reps=2, dp_reps=2)
    >>> out = run(cfg)
    >>> sorted(out.metrics)[:3], out.units["replications"]["fedit"]["type1_shifts"]  # 1 = rejected at 0.05
    (['copula_pooled', 'fedit', 'fedit_dp_eps1'], [0.0, 1.0, 0.0])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..common.plotting import new_figure, save_figure
from ..common.progress import progress
from ..common.results import SeedRun
from .baselines import BASELINES, fisher_combination, local_pvalues, stouffer_combination
from .data import diabetes_clients, monotone_shifts, shared_shifts, sign_flips
from .test import DP, FederatedIndependenceTest

ALPHA = 0.05


@dataclass
class Config:
    """Settings of one seed's run (``PRESETS`` holds smoke / quick / full)."""

    seed: int = 0
    """seed of every replication's data and of the tests' randomness"""
    h0_reps: int = 150
    """replications of each independent (H0) scenario"""
    h1_reps: int = 80
    """replications of each dependent (H1) scenario"""
    perm_reps: int = 40
    """replications for the permutation-null version (B permutations each)"""
    n_permutations: int = 200
    """B of the permutation null"""
    dep_sine: float = 0.35
    """strength of the sine dependence in the shared-shifts scenario"""
    dep_flip: float = 0.25
    """strength of the sign-flipping dependence"""
    dep_monotone: float = 0.3
    """correlation of the latent Gaussians in the monotone-shift scenario"""
    dp_n: int = 1000
    """client size of the privacy experiment"""
    dp_reps: int = 50
    """replications per hypothesis of the privacy arms (each replication's clients go to every arm)"""
    dp_epsilons: tuple[float, ...] = (8.0, 1.0)
    """privacy budgets (delta = 1e-5)"""
    random_features: int = 64
    """random Fourier features of the large-client (privacy) arms"""


PRESETS: dict[str, Config] = {
    "smoke": Config(h0_reps=10, h1_reps=6, perm_reps=3, n_permutations=50, dp_reps=3),
    "quick": Config(),
    "full": Config(h0_reps=300, h1_reps=150, perm_reps=100, n_permutations=300, dp_reps=60,
                   dp_epsilons=(8.0, 2.0, 1.0)),
}

H0 = {"type1_shifts": lambda rng, cfg: shared_shifts(rng, dep=0.0),
      "type1_monotone": lambda rng, cfg: monotone_shifts(rng, dep=0.0),
      "type1_real": lambda rng, cfg: diabetes_clients(rng, null=True)}
H1 = {"power_sine": lambda rng, cfg: shared_shifts(rng, dep=cfg.dep_sine),
      "power_flip": lambda rng, cfg: sign_flips(rng, dep=cfg.dep_flip),
      "power_monotone": lambda rng, cfg: monotone_shifts(rng, dep=cfg.dep_monotone),
      "power_real": lambda rng, cfg: diabetes_clients(rng, null=False)}


def _methods(seed: int) -> dict[str, Callable[[list], float]]:
    out: dict[str, Callable[[list], float]] = {
        "fedit": lambda c: FederatedIndependenceTest(random_state=seed).fit(c).pvalue_}
    out.update(BASELINES)
    return out


def _pvalues(methods: dict[str, Callable[[list], float]], clients: list) -> dict[str, float]:
    """Every method's p-value on one replication's clients (Fisher and Stouffer share the clients' p-values)."""
    local = local_pvalues(clients)
    shared = {"fisher": lambda c: fisher_combination(local), "stouffer": lambda c: stouffer_combination(local)}
    return {name: shared.get(name, test)(clients) for name, test in methods.items()}


def run(cfg: Config) -> SeedRun:
    """One seed's replications of every scenario: per-replication rejections (1/0) of every method."""
    rng = np.random.default_rng(cfg.seed)
    methods = _methods(cfg.seed)
    reject: dict[str, dict[str, list[float]]] = {name: {} for name in methods}
    scenarios = [(m, g, cfg.h0_reps) for m, g in H0.items()] + [(m, g, cfg.h1_reps) for m, g in H1.items()]
    for metric, generate, reps in progress(scenarios, desc=f"fedit seed {cfg.seed}"):
        for name in methods:
            reject[name][metric] = []
        for _ in range(reps):
            pvalues = _pvalues(methods, generate(rng, cfg))
            for name, p in pvalues.items():
                reject[name][metric].append(float(p < ALPHA))

    # the permutation null on the shared-shifts scenario
    reject["fedit_perm"] = {}
    for metric, dep in (("type1_shifts", 0.0), ("power_sine", cfg.dep_sine)):
        reject["fedit_perm"][metric] = []
        for r in range(cfg.perm_reps):
            test = FederatedIndependenceTest(null="permutation", n_permutations=cfg.n_permutations,
                                             random_state=1000 * cfg.seed + r)
            reject["fedit_perm"][metric].append(float(test.fit(shared_shifts(rng, dep=dep)).pvalue_ < ALPHA))

    # privacy: larger clients, random features, with and without (epsilon, 1e-5)-DP; in each replication every
    # arm tests the same clients with the same random features (pairs for the private_power comparison)
    arms: dict[str, DP | None] = {"fedit_large": None}
    arms.update({f"fedit_dp_eps{eps:g}": DP(eps) for eps in cfg.dp_epsilons})
    for arm in arms:
        reject[arm] = {"type1_error": [], "power": []}
    for metric, dep in (("type1_error", 0.0), ("power", cfg.dep_sine)):
        for r in range(cfg.dp_reps):
            clients = shared_shifts(rng, n=cfg.dp_n, dep=dep)
            for arm, privacy in arms.items():
                test = FederatedIndependenceTest(random_features=cfg.random_features, privacy=privacy,
                                                 random_state=2000 * cfg.seed + r)
                reject[arm][metric].append(float(test.fit(clients).pvalue_ < ALPHA))
    return SeedRun({}, units={"replications": reject})


def plot(runs: list[SeedRun], result: dict[str, Any], out_dir: Path) -> list[Path]:
    """Level (H0 scenarios) and power (H1 scenarios) per method, mean over seeds, with alpha marked."""
    arms = result["arms"]
    names = [a for a in arms if "type1_shifts" in arms[a] and "power_flip" in arms[a]]
    fig, axes = new_figure(1, 2, figsize=(11, 3.8))
    for ax, metrics, title in ((axes[0], list(H0), "type-I error (independent within clients)"),
                               (axes[1], list(H1), "power")):
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            ax.bar(np.arange(len(metrics)) + i * width, [arms[name][m]["mean"] for m in metrics], width, label=name)
        ax.set_xticks(np.arange(len(metrics)) + 0.4 - width / 2)
        ax.set_xticklabels([m.split("_", 1)[1] for m in metrics])
        ax.set_title(title)
        ax.set_ylim(0, 1.05)
    axes[0].axhline(ALPHA, color="k", lw=0.8, ls=":")
    axes[1].legend(fontsize=7)
    return [save_figure(fig, out_dir / f"{result['mode']}_level_and_power.png")]
