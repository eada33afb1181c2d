"""Reproduction: tree sizes of local-score branch-and-cut policies against the alternatives, as n grows.

Families (``families.py``; this project's constructions) and arms, all on the same instances:

- **A, tie-breaking**: strong branching (SB) with ties broken x-first (``sb_xfirst``), z-first (``sb_zfirst``),
  at random (``sb_random``, seeded); the exact minimum tree (``min_tree_a``).
- **B, SB suboptimal**: SB (``sb_b``), SB with fixing on an infeasible child (``sb_fixing_b``), the minimum tree
  (``min_tree_b``); a **learned** imitation of SB (sklearn gradient boosting on candidate features, trained on SB
  nodes at n = 5, 7; its score R^2 and top-1 agreement with SB measured on SB nodes at the largest n) and the
  **tree-size-aware** policy (the exact oracle's smallest subtrees).
- **C, score perturbation and few decisions** (``score_gap_family``: B with z costs that make SB's best z score
  beat the best x score by a relative margin, no ties anywhere): SB on margin 1e-6 (``exact_scores``) against the
  same scores times (1 + 2e-6) on the x variables (``perturbed_scores``: every score moves by at most 2e-6 of
  itself), and times (1 + 2e-6 U(-1, 1)) on every candidate (``random_scores``, seeded draws). With margin 0.5,
  where no small perturbation can flip anything, SB (``sb_c``) against a policy that takes SB's runner-up at its
  first decision and SB's choice everywhere else (``one_deviation``: one decision difference). Metrics ``ties``
  (branching decisions the tie rule decided) and ``decision_differences`` (nodes where the arm's choice differs
  from SB's at the same node).
- **D, RHS perturbation**: the root cut sum x <= (n-1)/2 + eps with eps = 0 (``exact_rhs``) and eps = 1e-3
  (``perturbed_rhs``): SB tree and minimum tree, the optimum supplied as cutoff.
- **E, cut selection**: three root cuts chosen by LP-bound improvement (``lp_bound_cuts``) or by objective
  orthogonality (``proxy_cuts``), then SB with fixing.
- **SCIP cross-check**: families A and B in SCIP (presolve, cuts, heuristics, propagation, conflicts and symmetry
  handling off) with SCIP's own strong branching: ``scip_fullstrong_a`` / ``_b`` (SB with its domain
  reductions, our ``sb_fixing`` convention) and ``scip_vanilla_a`` / ``_b`` (``vanillafullstrong``: SB scores
  only); ``scip_symmetry_b``: fullstrong with SCIP's default symmetry handling (it closes the root, ``scip.py``);
  ``scip_xfirst`` / ``scip_zfirst``: family A replaying our tie rules.

Instances, SB, the minimum trees, SCIP and the learned model are deterministic (the arms the claims compare;
computed once per process), so the card runs one seed and checks them ``exactly``. The two randomised arms,
``sb_random`` and ``random_scores``, take ``random_draws`` independent draws from the seed's generator and
record every draw's sizes as per-unit values (unit ``draws``, ids :func:`draw_ids`; the table shows their mean). Metrics:
``tree_size`` at the largest n, ``tree_size_n<k>`` per n, ``growth`` (geometric mean of the size ratio per +2
variables), ``lp_solves``; the minimum trees up to ``oracle_max_n``, and ``size_at_oracle_n`` (every arm's size
at the largest n the oracle reaches, for comparisons with it).

Example:
    >>> import dataclasses
    >>> from icml26.branch_and_cut.experiment import PRESETS, run
    >>> run(dataclasses.replace(PRESETS["smoke"], ns=(3, 5))).metrics["sb_xfirst"]["tree_size"]
    39.0
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..common.plotting import new_figure, save_figure
from ..common.progress import progress
from ..common.results import SeedRun
from .bnb import min_tree_size, solve_bnb
from .cuts import LPBoundImprovement, Proxy, objective_orthogonality
from .families import (
    cut_selection_family,
    rhs_perturbed_cut,
    sb_suboptimal_family,
    score_gap_family,
    tie_breaking_family,
)
from .policies import (
    DeviatingPolicy,
    LearnedPolicy,
    PerturbedPolicy,
    RecordingPolicy,
    StrongBranching,
    TreeSizeAware,
)


@dataclass
class Config:
    """Settings of one seed's run (``PRESETS`` holds smoke / quick / full)."""

    seed: int = 0
    """seed of the random tie-breaking and the random perturbation (also the learned model's random_state, which
    its fit does not draw on at this data size: no early-stopping split)"""
    random_draws: int = 5
    """independent draws of the randomised arms (random tie-breaking, random perturbation) per seed"""
    ns: tuple[int, ...] = (5, 7, 9)
    """sizes of the x block (odd)"""
    oracle_max_n: int = 9
    """largest n for the exponential minimum-tree oracle and the tree-size-aware policy"""
    rhs_eps: float = 1e-3
    """family D's right-hand-side perturbation"""
    score_margin: float = 1e-6
    """family C: relative margin by which SB's z score beats its x score at the root (score_perturbation)"""
    delta: float = 2e-6
    """family C: relative score perturbation (twice the margin: the smallest that flips the root comparison)"""
    decision_margin: float = 0.5
    """family C: the margin of the few-decisions arms (no perturbation below 50 % flips a decision)"""
    train_ns: tuple[int, ...] = (5, 7)
    """sizes whose SB nodes train the learned policy"""


PRESETS: dict[str, Config] = {
    "smoke": Config(ns=(3, 5), oracle_max_n=5, train_ns=(3,), random_draws=3),
    "quick": Config(),
    "full": Config(ns=(5, 7, 9, 11, 13), oracle_max_n=11),
}


@functools.cache
def _deterministic(arm: str, n: int, rhs_eps: float, margins: tuple[float, float, float]) -> dict[str, float]:
    """Tree size, LP solves, tie decisions and decision differences of a seed-free arm (cached: instances and SB
    are deterministic); ``margins`` = (score_margin, delta, decision_margin)."""
    score_margin, delta, decision_margin = margins
    sb = StrongBranching()
    differences = 0
    if arm == "sb_xfirst":
        s = solve_bnb(tie_breaking_family(n), sb)
    elif arm == "sb_zfirst":
        s = solve_bnb(tie_breaking_family(n), StrongBranching(tie_break="reverse"))
    elif arm == "sb_b":
        s = solve_bnb(sb_suboptimal_family(n), sb)
    elif arm == "sb_fixing_b":
        s = solve_bnb(sb_suboptimal_family(n), sb, sb_fixing=True)
    elif arm == "exact_scores":
        s = solve_bnb(score_gap_family(n, score_margin), sb)
    elif arm == "perturbed_scores":
        milp = score_gap_family(n, score_margin)
        bonus = np.array([1.0 if name.startswith("x") else 0.0 for name in milp.names])
        policy = PerturbedPolicy(sb, delta, bonus=bonus, relative=True)
        s = solve_bnb(milp, policy)
        differences = policy.differences
    elif arm == "sb_c":
        s = solve_bnb(score_gap_family(n, decision_margin), sb)
    elif arm == "one_deviation":
        policy = DeviatingPolicy(sb, deviations=1)
        s = solve_bnb(score_gap_family(n, decision_margin), policy)
        differences = policy.differences
    elif arm in ("exact_rhs", "perturbed_rhs"):
        milp, cutoff = rhs_perturbed_cut(n, 0.0 if arm == "exact_rhs" else rhs_eps)
        s = solve_bnb(milp, sb, cutoff=cutoff)
    elif arm in ("lp_bound_cuts", "proxy_cuts"):
        milp, cands = cut_selection_family(n)
        selector = LPBoundImprovement(k=3) if arm == "lp_bound_cuts" else Proxy(objective_orthogonality, k=3)
        s = solve_bnb(milp.add_cuts(selector.select(milp, cands)), sb, sb_fixing=True)
    else:
        raise KeyError(arm)
    if s.status == "node_limit":
        raise RuntimeError(f"{arm} at n={n} hit the node limit")
    return {"nodes": s.nodes, "lp_solves": s.lp_solves, "ties": s.ties, "decision_differences": differences}


#: (arm, family, rule, symmetry) of the SCIP cross-check
SCIP_ARMS = (("scip_fullstrong_a", "a", "fullstrong", False), ("scip_vanilla_a", "a", "vanillafullstrong", False),
             ("scip_fullstrong_b", "b", "fullstrong", False), ("scip_vanilla_b", "b", "vanillafullstrong", False),
             ("scip_symmetry_b", "b", "fullstrong", True), ("scip_xfirst", "a", "tie:index", False),
             ("scip_zfirst", "a", "tie:reverse", False))


@functools.cache
def _scip(n: int, family: str, rule: str, symmetry: bool) -> int:
    from .scip import scip_tree_size

    milp = tie_breaking_family(n) if family == "a" else sb_suboptimal_family(n)
    if rule.startswith("tie:"):
        return scip_tree_size(milp, tie_break=rule.removeprefix("tie:"))
    return scip_tree_size(milp, rule=rule, symmetry=symmetry)


@functools.cache
def _min_tree(family: str, n: int, rhs_eps: float) -> int:
    if family == "a":
        return min_tree_size(tie_breaking_family(n))
    if family == "b":
        return min_tree_size(sb_suboptimal_family(n))
    milp, cutoff = rhs_perturbed_cut(n, 0.0 if family == "d0" else rhs_eps)
    return min_tree_size(milp, cutoff=cutoff)


def _series(sizes: dict[int, float]) -> dict[str, float]:
    ns = sorted(sizes)
    out = {"tree_size": float(sizes[ns[-1]])}
    out.update({f"tree_size_n{n}": float(sizes[n]) for n in ns})
    ratios = [sizes[b] / sizes[a] for a, b in itertools.pairwise(ns) if sizes[a] > 0]
    out["growth"] = float(math.exp(np.mean(np.log(ratios)))) if ratios else 1.0
    return out


def _learned(cfg: Config) -> tuple[Any, dict[str, float]]:
    """Fit the imitation of SB's log-scores; its R^2 and top-1 agreement on SB nodes at the largest n."""
    from sklearn.ensemble import HistGradientBoostingRegressor
    from sklearn.metrics import r2_score

    def record(n: int) -> RecordingPolicy:
        milp = sb_suboptimal_family(n)
        rec = RecordingPolicy(StrongBranching(), milp)
        solve_bnb(milp, rec)
        return rec

    train = [record(n) for n in cfg.train_ns]
    x = np.vstack([f for r in train for f in r.features])
    y = np.log10(np.concatenate([t for r in train for t in r.targets]))
    model = HistGradientBoostingRegressor(max_iter=200, random_state=cfg.seed).fit(x, y)
    test = record(max(cfg.ns))
    pred = [model.predict(f) for f in test.features]
    truth = [np.log10(t) for t in test.targets]
    top1 = np.mean([int(np.argmax(p)) == int(np.argmax(t)) for p, t in zip(pred, truth, strict=True)])
    r2 = r2_score(np.concatenate(truth), np.concatenate(pred))
    return model, {"score_r2": float(r2), "top1_agreement": float(top1)}


def run(cfg: Config) -> SeedRun:
    """One seed: every arm on every n."""
    if not cfg.ns or any(n < 1 or n % 2 == 0 for n in cfg.ns):
        raise ValueError(f"ns must be odd positive sizes, got {cfg.ns}")
    if cfg.random_draws < 1:
        raise ValueError(f"random_draws must be >= 1, got {cfg.random_draws}")
    rng = np.random.default_rng([cfg.seed, 6])
    sizes: dict[str, dict[int, float]] = {}
    extra: dict[str, dict[str, float]] = {}
    deterministic = ("sb_xfirst", "sb_zfirst", "sb_b", "sb_fixing_b", "exact_scores", "perturbed_scores", "sb_c",
                     "one_deviation", "exact_rhs", "perturbed_rhs", "lp_bound_cuts", "proxy_cuts")
    margins = (cfg.score_margin, cfg.delta, cfg.decision_margin)
    for arm in progress(deterministic, desc=f"branch_and_cut seed {cfg.seed}"):
        for n in cfg.ns:
            out = _deterministic(arm, n, cfg.rhs_eps, margins)
            sizes.setdefault(arm, {})[n] = out["nodes"]
            if n == max(cfg.ns):
                extra[arm] = {"lp_solves": float(out["lp_solves"]), "ties": float(out["ties"]),
                              "decision_differences": float(out["decision_differences"])}
    draws: dict[str, list[dict[int, float]]] = {"sb_random": [], "random_scores": []}
    for _ in range(cfg.random_draws):   # draw 0 is what one seed drew before draws were recorded
        for arm in draws:
            draws[arm].append({})
        for n in cfg.ns:
            draws["sb_random"][-1][n] = solve_bnb(tie_breaking_family(n), StrongBranching(
                tie_break=np.random.default_rng(rng.integers(2**32)))).nodes
            draws["random_scores"][-1][n] = solve_bnb(score_gap_family(n, cfg.score_margin), PerturbedPolicy(
                StrongBranching(), cfg.delta, seed=int(rng.integers(2**32)), relative=True)).nodes
    for n in cfg.ns:                     # the independent solver: SCIP's own strong branching, and tie replays
        for arm, family, rule, symmetry in SCIP_ARMS:
            sizes.setdefault(arm, {})[n] = _scip(n, family, rule, symmetry)
    model, accuracy = _learned(cfg)
    for n in cfg.ns:
        milp = sb_suboptimal_family(n)
        sizes.setdefault("learned", {})[n] = solve_bnb(milp, LearnedPolicy(model).bind(milp)).nodes
    oracle_ns = [n for n in cfg.ns if n <= cfg.oracle_max_n]
    for n in oracle_ns:
        milp = sb_suboptimal_family(n)
        sizes.setdefault("tree_aware", {})[n] = solve_bnb(milp, TreeSizeAware(milp, max_n=n + 3)).nodes
        sizes.setdefault("min_tree_a", {})[n] = _min_tree("a", n, cfg.rhs_eps)
        sizes.setdefault("min_tree_b", {})[n] = _min_tree("b", n, cfg.rhs_eps)
    metrics: dict[str, dict[str, float]] = {arm: _series(s) for arm, s in sizes.items()}
    for arm, s in sizes.items():        # the size where the exact oracle still runs: comparable across arms
        metrics[arm]["size_at_oracle_n"] = float(s[max(oracle_ns)])
    per_draw: dict[str, dict[str, list[float]]] = {}
    for arm, runs in draws.items():     # every draw's metrics, in draw order (the mean is the arm's value)
        for s in runs:
            for name, value in {**_series(s), "size_at_oracle_n": float(s[max(oracle_ns)])}.items():
                per_draw.setdefault(arm, {}).setdefault(name, []).append(value)
    for arm, values in extra.items():
        metrics[arm].update(values)
    metrics["learned"].update(accuracy)
    for arm, fam in (("exact_rhs", "d0"), ("perturbed_rhs", "d1")):
        trees = {n: float(_min_tree(fam, n, cfg.rhs_eps)) for n in oracle_ns}
        metrics[arm]["min_tree_size"] = trees[max(oracle_ns)]
        metrics[arm].update({f"min_tree_size_n{n}": v for n, v in trees.items()})
    notes = {}
    if max(oracle_ns) < max(cfg.ns):
        text = (f"compared at n = {max(oracle_ns)}, the largest size the exponential minimum-tree oracle reaches; "
                f"the SB arms run to n = {max(cfg.ns)}")
        notes = {"learned_policy": text, "sb_suboptimal": text, "rhs_perturbation": text,
                 "scip_sb_suboptimal": text}
    # a draw is the seed's generator's i-th draw of both randomised arms (so draws of other seeds are other units);
    # nothing is trained or tuned on draws: no held-out set
    return SeedRun(metrics, series={"sizes": sizes, "draws": draws}, notes=notes, units={"draws": per_draw},
                   unit_ids={"draws": draw_ids(cfg.seed, cfg.random_draws)})


def draw_ids(seed: int, n: int) -> list[str]:
    """The ids of a seed's ``n`` draws of the randomised arms (unit ``draws``).

    Example:
        >>> draw_ids(100, 2)
        ['seed100:draw0', 'seed100:draw1']
    """
    return [f"seed{seed}:draw{i}" for i in range(n)]


def plot(runs: list[SeedRun], result: dict[str, Any], out_dir: Path) -> list[Path]:
    """Tree size against n (log scale), per arm, first seed (the randomised arms: the mean over their draws)."""
    fig, axes = new_figure(1, 3, figsize=(14, 3.8))
    sizes = dict(runs[0].series["sizes"])
    for arm, draws in runs[0].series["draws"].items():
        sizes[f"{arm} (mean of {len(draws)} draws)"] = {n: float(np.mean([d[n] for d in draws])) for n in draws[0]}
    groups = (("A/B: branching", ("sb_xfirst", "sb_zfirst", "sb_random", "sb_b", "sb_fixing_b", "learned",
                                  "tree_aware", "min_tree_b", "scip_fullstrong_b", "scip_vanilla_b")),
              ("C: no ties, one decision", ("exact_scores", "perturbed_scores", "random_scores", "sb_c",
                                            "one_deviation")),
              ("D/E: cuts", ("exact_rhs", "perturbed_rhs", "lp_bound_cuts", "proxy_cuts")))
    for ax, (title, arms) in zip(axes, groups, strict=True):
        for arm in arms:
            for key in (k for k in sizes if k == arm or k.startswith(f"{arm} (")):
                ns = sorted(sizes[key])
                ax.plot(ns, [sizes[key][n] for n in ns], marker="o", label=key)
        ax.set_yscale("log")
        ax.set_xlabel("n (size of the x block)")
        ax.set_ylabel("B&B nodes")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=6)
    return [save_figure(fig, out_dir / f"{result['mode']}_tree_sizes.png")]
