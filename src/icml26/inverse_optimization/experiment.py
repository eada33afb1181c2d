"""Reproduction of finite-regret online inverse optimisation on M-convex sets, with the corruption panel.

Four panels on the same seeds (``data.py`` environments; w* ~ U[0, 1]^d normalised):

1. **Regret against T.** Every environment in ``envs`` (top-k, pairwise, partition and graphic matroids), the
   centroid learner, the "any consistent point" ablation, ONS and OGD with the prior work's constants, T
   rounds, and the trivial arm ``random`` (the argmax of a fresh w ~ U[0, 1]^d each round, feedback ignored), which
   shows that the headline's comparison can be failed. Metrics ``<env>_regret`` (cumulative at T),
   ``<env>_growth`` = R(T) - R(T/4) (zero when the regret has stopped growing), ``<env>_mistakes``.
2. **Mistakes against d** (top-k, d in ``mistake_dims``), against the volume bound ln(d!) / ln(e/(e-1)).
3. **Corruption** (top-k, d = ``corruption_d``): the agent reveals its worst action in C rounds, either the first
   C (``early``) or C uniformly random rounds (``random``), C in ``corruptions``; the two robust learners
   (``restart``: discard everything on a contradiction; ``drop_cycle``: discard the rounds forming the cycle)
   against the variant that ignores contradicting constraints, ONS and OGD. ``over_bound_<when>_c<C>`` is
   mistakes / ((C + 1) ln(d!) / ln(e/(e-1))), the paper's O((C + 1) d log d) with the volume argument's constant.
4. **Adaptive adversary** (pairs, d = ``adaptive_d``, ``data.adaptive_pairs``): each round the pair the learner
   gets wrong with the smallest gap, until it orders every pair as w* does; ``adaptive_mistakes``,
   ``adaptive_regret`` and ``adaptive_over_bound`` (mistakes / the volume bound) for the centroid, the
   "any consistent point" ablation, ONS and OGD. On random streams every learner stops erring (panel 1 cannot
   tell them apart); here the adversary forces every mistake a learner can be made to commit.

No unit finer than the seed exists (each seed is one stream), so the claims pair the learners over the five seeds.

Example:
    >>> import dataclasses
    >>> from icml26.inverse_optimization.experiment import PRESETS, run
    >>> cfg = dataclasses.replace(PRESETS["smoke"], T=200)
    >>> sorted(run(cfg).metrics)
    ['centroid', 'consistent', 'drop_cycle', 'ignore', 'ogd', 'ons', 'random', 'restart']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..common.plotting import new_figure, save_figure
from ..common.progress import progress
from ..common.results import SeedRun
from .baselines import OGDLearner, ONSLearner
from .data import Environment, adaptive_pairs, simulate
from .learner import MConvexInverseLearner, mistake_bound


@dataclass
class Config:
    """Settings of one seed's run (``PRESETS`` holds smoke / quick / full)."""

    seed: int = 0
    """seed of w*, the feasible-set streams and the corrupted rounds"""
    T: int = 10_000
    """rounds per run"""
    envs: tuple[tuple[str, int], ...] = (("topk", 10), ("topk", 14), ("pairs", 14), ("partition", 10),
                                         ("graphic", 10))
    """(kind, d) of the regret panel; the first is the one the headline claims use"""
    mistake_dims: tuple[int, ...] = (4, 6, 8, 10, 12, 14)
    """dimensions of the mistakes-against-d panel (top-k)"""
    corruption_d: int = 10
    """dimension of the corruption panel (top-k)"""
    corruptions: tuple[int, ...] = (3, 10)
    """numbers C of corrupted rounds"""
    adaptive_d: int = 12
    """dimension of the adaptive-adversary panel (pairs)"""
    curve_points: int = 200
    """points kept of each regret curve for the plots"""


PRESETS: dict[str, Config] = {
    "smoke": Config(T=600, envs=(("topk", 10), ("graphic", 6)), mistake_dims=(4, 6, 8), corruptions=(10,),
                    adaptive_d=8),
    "quick": Config(),
    "full": Config(envs=(("topk", 10), ("topk", 14), ("topk", 16), ("pairs", 14), ("partition", 12),
                                   ("graphic", 10), ("graphic", 15)), mistake_dims=(4, 6, 8, 10, 12, 14, 16)),
}


def _learners(d: int, T: int, K: float, seed: int) -> dict[str, Any]:
    return {
        "centroid": MConvexInverseLearner(d, random_state=seed),
        "consistent": MConvexInverseLearner(d, centroid="consistent"),
        "ons": ONSLearner(d, K=K),
        "ogd": OGDLearner(d, T=T, K=K),
    }


class RandomLearner:
    """The trivial arm: recommends the argmax of a fresh w ~ U[0, 1]^d each round and ignores the feedback.

    It learns nothing, so its regret grows linearly in T; the headline's test must fail for it (card precondition
    ``random_fails_vs_ons``). Its own generator, so the other learners' streams are unchanged.
    """

    def __init__(self, d: int, seed: int):
        self.d = d
        self.rng = np.random.default_rng(seed)

    def predict(self, X: Any) -> np.ndarray:
        return X.argmax(self.rng.uniform(0.0, 1.0, size=self.d))

    def update(self, X: Any, x: np.ndarray) -> RandomLearner:
        return self


def _curve(values: np.ndarray, points: int) -> tuple[list[int], list[float]]:
    idx = np.unique(np.geomspace(1, len(values), num=points).astype(int)) - 1
    return (idx + 1).tolist(), values[idx].tolist()


@dataclass
class _Collector:
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    series: dict[str, Any] = field(default_factory=dict)

    def put(self, arm: str, name: str, value: float) -> None:
        self.metrics.setdefault(arm, {})[name] = float(value)


def run(cfg: Config) -> SeedRun:
    """One seed of the three panels."""
    out = _Collector()
    T, quarter = cfg.T, cfg.T // 4
    # 1. regret against T on every environment
    for kind, d in progress(cfg.envs, desc=f"inverse_optimization seed {cfg.seed}"):
        env_seed = 1000 * cfg.seed + d
        learners = _learners(d, T, Environment(kind, d, env_seed).diameter, cfg.seed)
        learners["random"] = RandomLearner(d, 6000 * cfg.seed + d)   # the trivial arm, panel 1 only
        regret = simulate(kind, d, env_seed, learners, T)
        tag = f"{kind}{d}"
        for name, r in regret.items():
            out.put(name, f"{tag}_regret", r[-1])
            out.put(name, f"{tag}_growth", r[-1] - r[quarter - 1])
            if name != "random":  # linear in T: its curve would flatten the others' in the plot
                out.series.setdefault("regret", {}).setdefault(tag, {})[name] = _curve(r, cfg.curve_points)
        for name in ("centroid", "consistent"):
            out.put(name, f"{tag}_mistakes", learners[name].n_mistakes_)
    # 2. mistakes against d, top-k
    ratios = []
    for d in cfg.mistake_dims:
        learner = MConvexInverseLearner(d, random_state=cfg.seed)
        simulate("topk", d, 2000 * cfg.seed + d, {"centroid": learner}, T)
        out.put("centroid", f"mistakes_d{d}", learner.n_mistakes_)
        ratios.append(learner.n_mistakes_ / mistake_bound(d))
    # $$\#\text{mistakes} / (\ln d! / \ln\frac{e}{e-1})$$, worst over d
    out.put("centroid", "max_mistakes_over_bound", max(ratios))
    # 3. corruption panel
    d = cfg.corruption_d
    env_seed = 3000 * cfg.seed + d
    K = Environment("topk", d, env_seed).diameter
    for C in cfg.corruptions:
        rng = np.random.default_rng(4000 * cfg.seed + C)
        for when, rounds in (("early", set(range(C))), ("random", set(rng.choice(T, size=C, replace=False).tolist()))):
            learners = {"restart": MConvexInverseLearner(d, on_cycle="restart", random_state=cfg.seed),
                        "drop_cycle": MConvexInverseLearner(d, on_cycle="drop_cycle", random_state=cfg.seed),
                        "ignore": MConvexInverseLearner(d, on_cycle="ignore", random_state=cfg.seed),
                        "ons": ONSLearner(d, K=K), "ogd": OGDLearner(d, T=T, K=K)}
            regret = simulate("topk", d, env_seed, learners, T, corrupted=rounds)
            for name, r in regret.items():
                out.put(name, f"regret_{when}_c{C}", r[-1])
                out.put(name, f"growth_{when}_c{C}", r[-1] - r[quarter - 1])
                out.put(name, f"mistakes_{when}_c{C}", learners[name].n_mistakes_)
                out.series.setdefault("corruption", {}).setdefault(f"{when}_c{C}", {})[name] = _curve(
                    r, cfg.curve_points)
            for name in ("restart", "drop_cycle"):
                # $$\#\text{mistakes} / ((C + 1) \ln d! / \ln\frac{e}{e-1})$$   (the paper's O((C+1) d log d))
                out.put(name, f"over_bound_{when}_c{C}", learners[name].n_mistakes_ / ((C + 1) * mistake_bound(d)))
                out.put(name, f"restarts_{when}_c{C}", learners[name].n_restarts_)
            out.put("drop_cycle", f"dropped_rounds_{when}_c{C}", learners["drop_cycle"].n_dropped_rounds_)
    # 4. adaptive adversary: the smallest-gap wrong pair, every round a mistake
    d = cfg.adaptive_d
    env_seed = 5000 * cfg.seed + d
    K = Environment("pairs", d, env_seed).diameter
    for name, learner in _learners(d, T, K, cfg.seed).items():
        mistakes, regret = adaptive_pairs(d, env_seed, learner, max_rounds=T)
        out.put(name, "adaptive_mistakes", mistakes)
        out.put(name, "adaptive_regret", regret)
        out.put(name, "adaptive_over_bound", mistakes / mistake_bound(d))
    return SeedRun(out.metrics, series=out.series)


def _regret_panels(runs: list[SeedRun], key: str, title: str, path: Path) -> Path:
    """One panel per tag of ``series[key]``: cumulative regret against t (log x), mean over seeds."""
    panels = runs[0].series[key]
    fig, axes = new_figure(1, len(panels), squeeze=False)
    for ax, (tag, arms) in zip(axes[0], panels.items(), strict=True):
        for name in arms:
            t = arms[name][0]
            ax.semilogx(t, np.mean([r.series[key][tag][name][1] for r in runs], axis=0), label=name)
        ax.set_title(title.format(tag=tag))
        ax.set_xlabel("round t")
    axes[0][0].set_ylabel("cumulative regret")
    axes[0][0].legend(fontsize=7)
    return save_figure(fig, path)


def plot(runs: list[SeedRun], result: dict[str, Any], out_dir: Path) -> list[Path]:
    """Regret against t (log x), mistakes against d with the bound, and the corruption panel (mean over seeds)."""
    mode = result["mode"]
    written = [_regret_panels(runs, "regret", "{tag}", out_dir / f"{mode}_regret.png")]

    dims = result["config"]["mistake_dims"]
    fig, ax = new_figure()
    means = [result["arms"]["centroid"][f"mistakes_d{d}"]["mean"] for d in dims]
    ax.plot(dims, means, marker="o", label="centroid learner (mean over seeds)")
    ax.plot(dims, [mistake_bound(d) for d in dims], ls="--", color="grey", label="ln(d!) / ln(e/(e-1))")
    ax.set_xlabel("d")
    ax.set_ylabel("mistakes")
    ax.legend(fontsize=7)
    written.append(save_figure(fig, out_dir / f"{mode}_mistakes.png"))
    written.append(_regret_panels(runs, "corruption", "corruption {tag}", out_dir / f"{mode}_corruption.png"))
    return written
