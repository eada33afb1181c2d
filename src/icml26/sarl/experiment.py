"""Reproduction: SARL against a fixed-input MLP baseline and ablations, with and without the safety shield.

**Training** (equal agent-sample budgets per method, never equal wall-clock): shared-parameter MAPPO on crossing
scenarios with a mix of 4-8 aircraft (R = 30 NM). Methods: ``sarl`` (PERG + SC-MoE, the Kinematic Safety Shield as a
training mask and at inference), ``sarl_no_shield`` (trained without the shield), ``mlp_knn`` (MLP over the 4
nearest intruders, the SectorCR-style fixed input), and in the full preset ``sarl_no_moe`` (PERG + MLP head, shield).
**Evaluation** (greedy actions, fresh seeded scenarios): at the training scale (N = 5, R = 30 NM) and at N = 20
density-matched (R = 60 NM, suffix ``_n20``; the full preset adds N = 10, ``_n10``). Every learned method without
the shield is also shown with the shield at inference only (``*_kss``), because the shield alone lifts any policy.
References: ``fly_straight`` and ``greedy_kss`` (direct-to when off track, else maintain, with the shield).

**Metrics** per episode: ``success`` (no LoS and every aircraft reached its exit), ``ac_conflict_free`` (share of
aircraft never in LoS), ``los_per_episode``, ``extra_path`` (flown / straight distance to the capture circle - 1),
``instructions_per_aircraft`` (non-maintain clearances), ``action_changes_per_aircraft``, ``overrides_per_aircraft``
(shield).

**Units**: evaluation episode i of a seed is the scenario drawn from the episode seed ``(50000 + seed [+ N], i)``
for every arm (``mappo.evaluate_episodes``), so episodes pair by index across arms; every metric but
``extra_path`` is recorded per episode (units ``episodes`` at N = 5, ``episodes_n20``, ``episodes_n10``) and the
checks pool them over seeds (falling back to the seed means when the trained policies differ between seeds beyond
the episode noise).

Example:
    >>> import dataclasses
    >>> from icml26.sarl.experiment import PRESETS, run
    >>> cfg = dataclasses.replace(PRESETS["smoke"], budget=200, eval_episodes=2, eval_episodes_n20=1)
    >>> sorted(run(cfg).metrics)[:3]
    ['fly_straight', 'greedy_kss', 'mlp_knn']
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..common.plotting import new_figure, save_figure
from ..common.results import SeedRun
from .env import AirspaceCore
from .mappo import PPOConfig, evaluate_episodes, fly_straight, greedy_direct, greedy_policy, train
from .policy import KNNMLPPolicy, SARLPolicy


@dataclass
class Config:
    """Settings of one seed's run (``PRESETS`` holds smoke / quick / full)."""

    seed: int = 0
    """seed of the policies, the training scenarios and the sampling"""
    budget: int = 40_000
    """agent-samples per trained method"""
    n_envs: int = 32
    """scenarios per rollout"""
    rollout: int = 32
    """decisions per rollout"""
    lr: float = 1e-3
    """Adam learning rate (every method)"""
    train_sizes: tuple[int, ...] = (4, 5, 6, 7, 8)
    """aircraft per training scenario (mixed)"""
    eval_episodes: int = 32
    """test episodes at the training scale"""
    eval_episodes_n20: int = 16
    """test episodes at N = 20 (and N = 10)"""
    scales: tuple[int, ...] = (20,)
    """extra test scales, density-matched"""
    no_moe: bool = False
    """also train the PERG + MLP-head ablation"""


PRESETS: dict[str, Config] = {
    "smoke": Config(budget=2_000, n_envs=8, rollout=16, eval_episodes=8, eval_episodes_n20=4),
    "quick": Config(),
    "full": Config(budget=150_000, eval_episodes=128, eval_episodes_n20=64, scales=(10, 20), no_moe=True),
}


def _core(n: int | tuple[int, ...], seed: int, envs: int) -> Callable[[], AirspaceCore]:
    size = n if isinstance(n, int) else max(n)
    radius = 30.0 * np.sqrt(max(size, 5) / 5.0) if isinstance(n, int) else 30.0
    steps = int(80 * radius / 30.0)
    sizes = n if isinstance(n, int) else list(n)
    return lambda: AirspaceCore(n_envs=envs, n_aircraft=sizes, radius_nm=radius, max_steps=steps,
                                scenario="crossing", seed=seed)


_NAMES = {"los_events": "los_per_episode", "instructions": "instructions_per_aircraft",
          "changes": "action_changes_per_aircraft", "overrides": "overrides_per_aircraft"}
#: per-episode metrics recorded as units (finite in every episode); extra_path (NaN when no aircraft arrived)
#: stays a per-seed mean over the episodes where it exists
UNIT_METRICS = ("success", "ac_conflict_free", "los_events", "instructions", "changes", "overrides")


def episode_metrics(eps: list[dict[str, float]], suffix: str) -> tuple[dict[str, float], dict[str, list[float]]]:
    """``(seed-level metrics, per-episode values)`` of one arm at one scale, names with ``suffix``."""
    units = {_NAMES.get(k, k) + suffix: [float(e[k]) for e in eps] for k in UNIT_METRICS}
    extra = [e["extra_path"] for e in eps if np.isfinite(e["extra_path"])]
    metrics = {"extra_path" + suffix: float(np.mean(extra))} if extra else {}
    return metrics, units


def run(cfg: Config) -> SeedRun:
    """One seed: train the learned methods on equal budgets, evaluate everything at every scale."""
    if cfg.budget < 1 or not cfg.train_sizes:
        raise ValueError("budget must be >= 1 and train_sizes non-empty")
    torch.manual_seed(cfg.seed)
    ppo = PPOConfig(n_envs=cfg.n_envs, rollout=cfg.rollout, lr=cfg.lr)
    train_core = _core(tuple(cfg.train_sizes), 1000 + cfg.seed, cfg.n_envs)
    methods: dict[str, tuple[Any, str, bool]] = {
        "sarl": (SARLPolicy(), "graph", True),
        "sarl_no_shield": (SARLPolicy(), "graph", False),
        "mlp_knn": (KNNMLPPolicy(), "knn", False)}
    if cfg.no_moe:
        methods["sarl_no_moe"] = (SARLPolicy(moe=False), "graph", True)
    curves = {}
    for name, (policy, kind, shielded) in methods.items():
        hist = train(policy, kind, train_core, ppo, total_agent_steps=cfg.budget, seed=cfg.seed,
                     shield_train=shielded, desc=f"sarl seed {cfg.seed} {name}")
        curves[name] = [(h["agent_steps"], h["success"]) for h in hist]
    arms: dict[str, tuple[Callable[[AirspaceCore], np.ndarray], bool]] = {
        "fly_straight": (fly_straight, False), "greedy_kss": (greedy_direct, True)}
    for name, (policy, kind, shielded) in methods.items():
        act = greedy_policy(policy, kind, shield_mask=shielded)
        arms[name] = (act, shielded)
        if not shielded:
            arms[f"{name}_kss"] = (act, True)
    metrics: dict[str, dict[str, float]] = {}
    units: dict[str, dict[str, dict[str, list[float]]]] = {}
    eval_seed = 50_000 + cfg.seed
    scales = [(5, cfg.eval_episodes, "")] + [(n, cfg.eval_episodes_n20, f"_n{n}") for n in cfg.scales]
    for name, (act, shield_eval) in arms.items():
        metrics[name] = {}
        for n, episodes, suffix in scales:
            # the same seeded scenarios for every arm: episodes pair by index across arms
            seeds = [(eval_seed + (n if suffix else 0), i) for i in range(episodes)]
            eps = evaluate_episodes(act, _core(n, eval_seed, min(episodes, 32)), episode_seeds=seeds,
                                    shield_eval=shield_eval)
            m, u = episode_metrics(eps, suffix)
            metrics[name].update(m)
            units.setdefault("episodes" + suffix, {})[name] = u
    return SeedRun(metrics, series={"curves": curves}, units=units)


def plot(runs: list[SeedRun], result: dict[str, Any], out_dir: Path) -> list[Path]:
    """Training success against agent-samples (first seed) and conflict-free share per arm and scale."""
    fig, (ax, bx) = new_figure(1, 2, figsize=(10, 3.6))
    for name, curve in runs[0].series["curves"].items():
        if curve:
            ax.plot([c[0] for c in curve], [c[1] for c in curve], label=name)
    ax.set_xlabel("agent-samples")
    ax.set_ylabel("training success (recent episodes)")
    ax.legend(fontsize=7)
    arms = list(result["arms"])
    for j, suffix in enumerate(["", "_n20"]):
        ys = [result["arms"][a].get(f"ac_conflict_free{suffix}", {}).get("mean", np.nan) for a in arms]
        bx.bar(np.arange(len(arms)) + 0.4 * j, ys, width=0.4, label="N=5" if not suffix else "N=20")
    bx.set_xticks(np.arange(len(arms)) + 0.2, arms, rotation=35, ha="right", fontsize=7)
    bx.set_ylabel("aircraft conflict-free")
    bx.legend(fontsize=7)
    return [save_figure(fig, out_dir / f"{result['mode']}_sarl.png")]
