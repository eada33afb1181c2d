"""Reproduction of the federated independence test: level under heterogeneity (also with many small clients),
power, privacy.

Each seed runs independent replications of every scenario (``data.py``) and every method on the same data:
the proposed test (copula + stacking, exact-moment gamma null), its permutation-null version, the baselines
(``baselines.py``: pooled raw HSIC, pooled global ranks, copula + pooled, Fisher, Stouffer, stacked without
alignment, stacked with the asymptotic null moments) and the private test at epsilon in ``dp_epsilons``. Each
replication's rejection at alpha = 0.05 is recorded (1 or 0) as a unit ``replications``, in the same order for
every method, so that methods pair by replication (the same data went to each); the metric is the rejection rate:

- ``type1_shifts`` / ``type1_monotone`` / ``type1_real`` on data independent within every client (shared
  location-scale shifts; non-linear monotone marginal maps with unequal client sizes; diabetes split by age
  with Y permuted within clients);
- ``power_sine`` (shared shifts + sine dependence), ``power_flip`` (dependence whose sign flips across
  clients), ``power_monotone``, ``power_real`` (bmi against progression in the diabetes clients);
- the permutation null (``fedit_perm``) on its own shared-shifts replications;
- the private arms on larger clients (n = ``dp_n``, random features): ``type1_error`` and ``power``, with
  ``fedit_large`` the same test without privacy, every arm on the same clients in each replication (the
  power curve over epsilon);
- the validity panel with many small clients, shared shifts: ``type1_20x8`` (20 clients of 8 rows),
  ``type1_50x6`` and ``type1_mixed`` (``data.MIXED_SIZES``), for the proposed test, the same test with the
  asymptotic null moments (``fedit_asymptotic``), Fisher and Stouffer;
- full mode only, ``min_size_reps > 0``: the level of the exact-moment gamma null by client size n (arms
  ``gamma_n4``, ...) and number of clients (metrics ``K1``, ``K2``, ...), computed with the core functions
  (clients of 4 rows are refused by the test itself); a rate per seed, no per-unit values.

The card's checks pool the replications of all seeds (a type-I error claim is a Clopper-Pearson bound on the
rejections of one scenario; a power comparison is the Agresti–Min interval for matched pairs over paired replications).

**Unit ids** (verdicts v3; :func:`replication_ids`): every per-replication metric carries its own id list
(``unit_ids["arm.metric"]``), ``"<scenario>/s<seed>/r<i>"``: the i-th replication of a scenario on a seed. The
arms that test the same data in a replication get the same ids (every method of a main scenario; the
non-private and private arms of the privacy experiment; the arms of a small-client scenario), so a paired check
pairs them; the permutation null has its own scenarios (``perm_type1_shifts``, ``perm_power_sine``: other
draws than ``fedit.type1_shifts``), and so do the privacy arms (``dp_type1_error``, ``dp_power``). Every
replication draws fresh clients, so no id repeats within or across seeds and scenarios; nothing is trained or
tuned on replications, so there is no held-out set.

Example:
    >>> import dataclasses
    >>> from icml26.fedit.experiment import PRESETS, run
    >>> cfg = dataclasses.replace(PRESETS["smoke"], h0_reps=3, h1_reps=2, perm_reps=2, dp_reps=2, small_reps=2)
    >>> out = run(cfg)
    >>> sorted(out.metrics)[:3], out.units["replications"]["fedit"]["type1_shifts"]  # 1 = rejected at 0.05
    (['copula_pooled', 'fedit', 'fedit_asymptotic'], [0.0, 1.0, 0.0])
    >>> out.unit_ids["fedit.type1_shifts"] == out.unit_ids["pooled.type1_shifts"]  # the same data, paired
    True
    >>> out.unit_ids["fedit_perm.type1_shifts"]
    ['perm_type1_shifts/s0/r0', 'perm_type1_shifts/s0/r1']
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
from .baselines import BASELINES, fisher_combination, local_pvalues, stacked_asymptotic, stouffer_combination
from .core import aggregate, client_statistics, copula_transform, uniform_median_bandwidth
from .data import MIXED_SIZES, diabetes_clients, monotone_shifts, shared_shifts, sign_flips
from .test import DP, FederatedIndependenceTest

ALPHA = 0.05


@dataclass
class Config:
    """Settings of one seed's run (``PRESETS`` holds smoke / quick / full)."""

    seed: int = 0
    """seed of every replication's data and of the tests' randomness"""
    h0_reps: int = 120
    """replications of each independent (H0) scenario"""
    h1_reps: int = 60
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
    dp_reps: int = 60
    """replications per hypothesis of the privacy arms (each replication's clients go to every arm)"""
    dp_epsilons: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0)
    """privacy budgets of the power curve (delta = 1e-5)"""
    random_features: int = 64
    """random Fourier features of the large-client (privacy) arms"""
    small_reps: int = 150
    """replications of each small-client H0 scenario (20 x 8, 50 x 6, mixed sizes)"""
    min_size_reps: int = 0
    """replications per (client size, number of clients) cell of the minimum-size table (0: skipped)"""
    min_size_n: tuple[int, ...] = (4, 5, 6, 8)
    """client sizes of the minimum-size table"""
    min_size_k: tuple[int, ...] = (1, 2, 5, 20)
    """numbers of clients of the minimum-size table"""


PRESETS: dict[str, Config] = {
    "smoke": Config(h0_reps=10, h1_reps=6, perm_reps=3, n_permutations=50, dp_reps=3, small_reps=5),
    "quick": Config(),
    "full": Config(h0_reps=300, h1_reps=150, perm_reps=100, n_permutations=300, dp_reps=200, small_reps=400,
                   min_size_reps=1000),
}

H0 = {"type1_shifts": lambda rng, cfg: shared_shifts(rng, dep=0.0),
      "type1_monotone": lambda rng, cfg: monotone_shifts(rng, dep=0.0),
      "type1_real": lambda rng, cfg: diabetes_clients(rng, null=True)}
H1 = {"power_sine": lambda rng, cfg: shared_shifts(rng, dep=cfg.dep_sine),
      "power_flip": lambda rng, cfg: sign_flips(rng, dep=cfg.dep_flip),
      "power_monotone": lambda rng, cfg: monotone_shifts(rng, dep=cfg.dep_monotone),
      "power_real": lambda rng, cfg: diabetes_clients(rng, null=False)}
SMALL = {"type1_20x8": lambda rng: shared_shifts(rng, K=20, n=8),
         "type1_50x6": lambda rng: shared_shifts(rng, K=50, n=6),
         "type1_mixed": lambda rng: shared_shifts(rng, sizes=MIXED_SIZES)}
SMALL_ARMS = ("fedit", "fedit_asymptotic", "fisher", "stouffer")


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


def replication_ids(scenario: str, seed: int, reps: int) -> list[str]:
    """The ids of a scenario's replications on one seed: ``"<scenario>/s<seed>/r<i>"``.

    Example:
        >>> replication_ids("type1_shifts", 3, 2)
        ['type1_shifts/s3/r0', 'type1_shifts/s3/r1']
    """
    return [f"{scenario}/s{seed}/r{i}" for i in range(reps)]


def min_size_level(rng: np.random.Generator, n: int, K: int, reps: int) -> float:
    """Rejection rate at alpha of the exact-moment gamma null for K independent clients of n rows under H0
    (the core functions the clients and the server run, without the test's minimum-size check)."""
    b = uniform_median_bandwidth(1)
    rejections = 0
    for _ in range(reps):
        stats = [client_statistics(copula_transform(rng.normal(size=n)), copula_transform(rng.normal(size=n)), b, b)
                 for _ in range(K)]
        rejections += aggregate(stats).pvalue < ALPHA
    return rejections / reps


def run(cfg: Config) -> SeedRun:
    """One seed's replications of every scenario: per-replication rejections (1/0) of every method."""
    rng = np.random.default_rng(cfg.seed)
    methods = _methods(cfg.seed)
    reject: dict[str, dict[str, list[float]]] = {name: {} for name in methods}
    # "arm.metric" -> the ids of its replications; arms tested on the same clients share a scenario's ids
    ids: dict[str, list[str]] = {}
    scenarios = [(m, g, cfg.h0_reps) for m, g in H0.items()] + [(m, g, cfg.h1_reps) for m, g in H1.items()]
    for metric, generate, reps in progress(scenarios, desc=f"fedit seed {cfg.seed}"):
        for name in methods:
            reject[name][metric] = []
            ids[f"{name}.{metric}"] = replication_ids(metric, cfg.seed, reps)
        for _ in range(reps):
            pvalues = _pvalues(methods, generate(rng, cfg))
            for name, p in pvalues.items():
                reject[name][metric].append(float(p < ALPHA))

    # the permutation null on the shared-shifts scenario
    reject["fedit_perm"] = {}
    for metric, dep in (("type1_shifts", 0.0), ("power_sine", cfg.dep_sine)):
        reject["fedit_perm"][metric] = []
        ids[f"fedit_perm.{metric}"] = replication_ids(f"perm_{metric}", cfg.seed, cfg.perm_reps)
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
    for metric, dep in progress((("type1_error", 0.0), ("power", cfg.dep_sine)), desc=f"fedit privacy seed {cfg.seed}"):
        for arm in arms:
            ids[f"{arm}.{metric}"] = replication_ids(f"dp_{metric}", cfg.seed, cfg.dp_reps)
        for r in range(cfg.dp_reps):
            clients = shared_shifts(rng, n=cfg.dp_n, dep=dep)
            for arm, privacy in arms.items():
                test = FederatedIndependenceTest(random_features=cfg.random_features, privacy=privacy,
                                                 random_state=2000 * cfg.seed + r)
                reject[arm][metric].append(float(test.fit(clients).pvalue_ < ALPHA))

    # the validity panel with many small clients (independent within every client, shared shifts)
    small = {"fedit": methods["fedit"], "fedit_asymptotic": stacked_asymptotic}
    reject["fedit_asymptotic"] = {}
    for metric, generate in progress(list(SMALL.items()), desc=f"fedit small clients seed {cfg.seed}"):
        for arm in SMALL_ARMS:
            reject[arm][metric] = []
            ids[f"{arm}.{metric}"] = replication_ids(metric, cfg.seed, cfg.small_reps)
        for _ in range(cfg.small_reps):
            clients = generate(rng)
            local = local_pvalues(clients)
            pvalues = {name: test(clients) for name, test in small.items()}
            pvalues.update(fisher=fisher_combination(local), stouffer=stouffer_combination(local))
            for arm in SMALL_ARMS:
                reject[arm][metric].append(float(pvalues[arm] < ALPHA))

    metrics: dict[str, dict[str, float]] = {}
    if cfg.min_size_reps:
        for n in progress(cfg.min_size_n, desc="fedit minimum client size"):
            metrics[f"gamma_n{n}"] = {f"K{K}": min_size_level(rng, n, K, cfg.min_size_reps) for K in cfg.min_size_k}
    return SeedRun(metrics, units={"replications": reject}, unit_ids=ids)


def _rate_and_ci(values: list[list[float]]) -> tuple[float, float, float]:
    """Pooled rejection rate and its two-sided 95 % Clopper-Pearson interval."""
    from scipy.stats import binomtest

    flat = [v for seed in values for v in seed]
    k, n = round(sum(flat)), len(flat)
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    return k / n, ci.low, ci.high


def plot(runs: list[SeedRun], result: dict[str, Any], out_dir: Path) -> list[Path]:
    """Level and power per method (with alpha marked); the small-client validity panel; the private power curve."""
    arms = result["arms"]
    mode = result["mode"]
    paths = []
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
    paths.append(save_figure(fig, out_dir / f"{mode}_level_and_power.png"))

    # validity panel: pooled type-I error with 95 % Clopper-Pearson intervals
    fig, ax = new_figure(figsize=(7.5, 3.6))
    metrics = list(SMALL)
    width = 0.8 / len(SMALL_ARMS)
    for i, arm in enumerate(SMALL_ARMS):
        rates = [_rate_and_ci(arms[arm][m]["unit_values"]) for m in metrics]
        x = np.arange(len(metrics)) + i * width
        ax.bar(x, [r[0] for r in rates], width, label=arm)
        ax.errorbar(x, [r[0] for r in rates], yerr=[[r[0] - r[1] for r in rates], [r[2] - r[0] for r in rates]],
                    fmt="none", color="k", lw=0.8)
    ax.axhline(ALPHA, color="k", lw=0.8, ls=":")
    ax.axhline(ALPHA + 0.02, color="r", lw=0.8, ls="--", label="alpha + 0.02")
    ax.set_xticks(np.arange(len(metrics)) + 0.4 - width / 2)
    ax.set_xticklabels(["20 x 8", "50 x 6", "mixed sizes"])
    ax.set_ylabel("type-I error (alpha = 0.05)")
    ax.set_title("many small clients, independent within every client")
    ax.legend(fontsize=7)
    paths.append(save_figure(fig, out_dir / f"{mode}_small_clients.png"))

    # the private power curve over epsilon, beside the non-private test on the same clients
    eps_arms = sorted((float(a.removeprefix("fedit_dp_eps")), a) for a in arms if a.startswith("fedit_dp_eps"))
    if eps_arms:
        fig, axes = new_figure(1, 2, figsize=(10, 3.6))
        for ax, metric, title in ((axes[0], "power", "power (sine dependence, n = 1000 per client)"),
                                  (axes[1], "type1_error", "type-I error")):
            rates = [_rate_and_ci(arms[a][metric]["unit_values"]) for _, a in eps_arms]
            eps = [e for e, _ in eps_arms]
            ax.errorbar(eps, [r[0] for r in rates], yerr=[[r[0] - r[1] for r in rates], [r[2] - r[0] for r in rates]],
                        marker="o", capsize=3, label="private (sqrt(R_k) + noise)")
            ref = _rate_and_ci(arms["fedit_large"][metric]["unit_values"])[0]
            ax.axhline(ref, color="g", ls="--", lw=1, label="non-private, same clients")
            if metric == "type1_error":
                ax.axhline(ALPHA, color="k", lw=0.8, ls=":")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("epsilon (delta = 1e-5)")
            ax.set_title(title)
            ax.set_ylim(0, 1.05)
        axes[0].legend(fontsize=7)
        paths.append(save_figure(fig, out_dir / f"{mode}_private_power.png"))
    return paths
