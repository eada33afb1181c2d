"""Reproduction of multi-way alignment: retrieval, stitching and geometry of GPA, multi-view CCA and GCPA.

On each seed, M models embed the same items (``data.py``) in three embedded model sets: five networks trained
on digits (``digits``), four text encoders on a bundled docstring corpus (``text``) and six scikit-learn models
on the bundled breast-cancer table (``tabular``). Every arm is fitted on the training items' embeddings (the
anchors) and evaluated on held-out items:

- arms: no alignment (the trivial baseline), pairwise orthogonal Procrustes (M (M - 1) maps), pairwise CCA
  (M (M - 1) / 2 fits), GPA, generalised CCA (MAXVAR, the default CCA form and the baseline the card compares
  with) and SUMCOR, GCPA at its scale-free default (c = 1: gamma = tr(Sigma_w) / k), GCPA with c chosen on a
  validation split (``gcpa_tuned``), GCPA with the first version's absolute gamma = 1e-3
  (``gcpa_absolute``), GCPA fitted on M - 1 models with the last one added by ``add_view``
  (``gcpa_extended``), and a ceiling: generalised CCA fitted on the held-out items themselves
  (``oracle_gcca``, the best a linear shared space does when it knows the test pairing);
- the CCA shrinkage of ``gcca`` and ``mcca_sumcor`` and GCPA's c of ``gcpa_tuned`` are each chosen from a
  five-value grid by any-to-any Recall@1 on a validation split of the training anchors (never the test
  items), so the baselines get at least the method's tuning (the ``gcpa`` arm itself is not tuned);
- metrics: any-to-any Recall@1 / Recall@5 / MRR over all ordered model pairs, stitching accuracy (a head
  trained on one model's aligned features applied to another's), geometry distortion of each model's
  pairwise distances, fit seconds, and the number of maps each method needs;
- a sensitivity sweep of GCPA's c (``series["gamma_sweep"]``), drawn by ``plot``.

The held-out items are the units of the retrieval and stitching claims: for ``UNIT_ARMS`` each item's Recall@1
and stitching accuracy over the M (M - 1) ordered model pairs is recorded (``units["items"]``, in the same item
order for every arm), per model set (``digits_*``, ``text_*``, ``tabular_*``) and pooled over the three sets
(``all_*``: the sets' items concatenated, digits then text then tabular). An item, not a (pair, item) query, is
the unit because the queries of one item across pairs are not independent.

**Item ids** (verdicts v3; :func:`item_ids`): a row of the bundled digits or breast-cancer data, or a
sentence's text hash, the same id on every seed that holds the item out (a fixed pool split anew by each seed,
so v3 adds the variance of the items the seeds share). The pooled ``all_*`` metrics carry the ids of the unit
name (``unit_ids["items"]``: every model set's held-out items in ``DATASETS`` order), each per-set metric its
own (``unit_ids["<arm>.<set>_<metric>"]``: that set's items). The held-out sets are keyed alike: the anchors
(``train``: every arm is fitted on them and the embedding models trained on them) and the validation anchors
(``validation``, a subset of them) of the same model sets.

Example:
    >>> import dataclasses
    >>> from icml26.gcpa.experiment import PRESETS, run
    >>> cfg = dataclasses.replace(PRESETS["smoke"], datasets=("tabular",))
    >>> out = run(cfg)
    >>> "tabular_recall_at_1" in out.metrics["gcpa"], "all_recall_at_1" in out.metrics["gcpa"]
    (True, True)
    >>> len(out.units["items"]["gcpa"]["all_recall_at_1"]) == len(out.units["items"]["gpa"]["all_recall_at_1"])
    True
    >>> out.unit_ids["items"] == out.unit_ids["gcpa.tabular_recall_at_1"], out.overlap()["items"]
    (True, {'train': 0, 'validation': 0})
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..common.plotting import new_figure, save_figure
from ..common.progress import progress
from ..common.results import SeedRun
from ..common.tuning import Rule, tune_per_arm
from .core import residual_whitening
from .data import MultiViewData, digits_views, tabular_views, text_views
from .estimators import (
    GCPA,
    GeneralizedProcrustes,
    MultiviewCCA,
    NoAlignment,
    PairwiseCCA,
    PairwiseProcrustes,
)
from .metrics import any_to_any_ranks, geometry_distortion, retrieval_per_item, stitching_correct

#: arms whose per-item retrieval and stitching outcomes are recorded (the arms the card's checks compare)
UNIT_ARMS = ("none", "gpa", "gcca", "gcpa", "gcpa_extended")
#: arms whose stitching accuracy is measured (a logistic head per model and arm: the costliest metric)
STITCHING_ARMS = (*UNIT_ARMS, "pairwise_procrustes", "mcca_sumcor", "gcpa_tuned")
#: the model sets, in the order their items are concatenated into the pooled ``all_*`` units
DATASETS = ("digits", "text", "tabular")


@dataclass
class Config:
    """Settings of one seed's run (``PRESETS`` holds smoke / quick / full)."""

    seed: int = 0
    """seed of the splits, the trained models, the validation split and the heads"""
    datasets: tuple[str, ...] = DATASETS
    """embedded model sets to run: 'digits' (5 trained networks), 'text' (4 text encoders), 'tabular' (6 sklearn
    models on breast cancer)"""
    digits_steps: int = 300
    """training steps of each digits network"""
    digits_components: int = 24
    """common dimension k for the digits models (their widths are 32-48)"""
    text_components: int = 32
    """common dimension k for the text models (widths 64-384)"""
    tabular_components: int = 16
    """common dimension k for the tabular models (widths 24-48)"""
    text_max_sentences: int | None = None
    """use only the first sentences of the corpus (smoke runs); None = all 2,498"""
    tabular_max_iter: int = 400
    """training epochs of each tabular MLPClassifier"""
    cca_reg_grid: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3, 0.6)
    """CCA shrinkage values the validation split chooses from (gcca, mcca_sumcor)"""
    gcpa_reg: float = 1.0
    """GCPA's default correction strength c (gamma = c tr(Sigma_w) / k; the mean residual eigenvalue)"""
    gcpa_reg_grid: tuple[float, ...] = (0.1, 0.3, 1.0, 3.0, 10.0)
    """GCPA c values the validation split chooses from (gcpa_tuned)"""
    gcpa_absolute_reg: float = 1e-3
    """the first version's absolute gamma (gcpa_absolute), kept to show what the scale-free ridge fixes"""
    validation_fraction: float = 0.2
    """fraction of the training anchors held out to choose the tuned arms' regularisers"""
    sweep: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 100.0)
    """GCPA c values of the sensitivity sweep (plot only; not used by any claim)"""
    threads: int = 1
    """torch intra-op threads"""


PRESETS: dict[str, Config] = {
    "smoke": Config(digits_steps=60, text_max_sentences=400, tabular_max_iter=100),
    "quick": Config(),
    "full": Config(digits_steps=600),
}


def validation_recall(
    make: Callable[[float], Any], grid: tuple[float, ...], train: list[np.ndarray], fraction: float, seed: int
) -> tuple[float, dict[float, float]]:
    """Choose a regulariser from ``grid`` by any-to-any Recall@1 on a held-out part of the training anchors.

    The anchors are split once (seeded); each value is fitted on the rest and scored on the held-out anchors;
    the best value wins (the first of the grid on ties). Returns ``(chosen, {value: validation Recall@1})``.
    """
    val, fit = validation_split(train[0].shape[0], fraction, seed)
    base = None

    def recall(arm: str, value: float, draw: int) -> float:
        nonlocal base
        model = make(value)
        if isinstance(model, GCPA):  # one GPA fit for the whole grid; only the correction depends on c
            if base is None:
                base = model.fit([X[fit] for X in train])
            model = _with_reg(base, [X[fit] for X in train], value)
        else:
            model.fit([X[fit] for X in train])
        return float(np.mean(any_to_any_ranks(model, [X[val] for X in train]) < 1))

    record = tune_per_arm({"reg": grid}, recall, Rule(draws=1, maximize=True, ties="first")).record["reg"]
    return record["chosen"], dict(zip(record["grid"], record["scores"], strict=True))


def validation_split(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The anchors (positions among the ``n`` training items) held out to choose a regulariser, and the rest.

    Example:
        >>> val, fit = validation_split(10, 0.2, 0)
        >>> len(val), len(fit), sorted([*val, *fit]) == list(range(10))
        (2, 8, True)
    """
    perm = np.random.default_rng([seed, 7]).permutation(n)
    n_val = max(2, round(fraction * n))
    return np.sort(perm[:n_val]), np.sort(perm[n_val:])


def item_ids(data: MultiViewData, cfg: Config) -> tuple[list[str], dict[str, list[str]]]:
    """``(test ids, {"train": ids, "validation": ids})`` of one model set, in ``evaluate``'s item order.

    An item is a row of the bundled data set (digits, breast cancer) or a sentence (its text hash): the sets are
    fixed pools the seed splits anew, so an item held out on several seeds keeps its id. ``train`` are the anchors
    every arm is fitted on (and the embedding models trained on); ``validation`` the anchors the tuned arms choose
    their regulariser on (a subset of ``train``).
    """
    val, _ = validation_split(len(data.train_ids), cfg.validation_fraction, cfg.seed)
    return list(data.test_ids), {"train": list(data.train_ids), "validation": [data.train_ids[i] for i in val]}


def _with_reg(model: GCPA, train: list[np.ndarray], c: float) -> GCPA:
    """A copy of a fitted GCPA with the correction recomputed for relative strength ``c`` (same GPA universe)."""
    aligned = [
        model.preprocess(X, m) @ R for m, (X, R) in enumerate(zip(train, model.rotations_, strict=True))
    ]
    out = copy.copy(model)
    out.reg = c
    out.correction_, out.gamma_ = residual_whitening(aligned, model.universe_, c)
    return out


def make_arms(k: int, cfg: Config, data: MultiViewData | None = None) -> dict[str, Any]:
    """The compared methods, unfitted, at common dimension ``k`` (regularisers tuned on ``data``'s anchors)."""
    chosen = {"gcca": 0.1, "mcca_sumcor": 0.1, "gcpa_tuned": cfg.gcpa_reg}
    if data is not None:
        v = (cfg.validation_fraction, cfg.seed)
        chosen["gcca"], _ = validation_recall(
            lambda r: MultiviewCCA(k, reg=r, method="maxvar"), cfg.cca_reg_grid, data.train, *v
        )
        chosen["mcca_sumcor"], _ = validation_recall(
            lambda r: MultiviewCCA(k, reg=r, method="sumcor"), cfg.cca_reg_grid, data.train, *v
        )
        chosen["gcpa_tuned"], _ = validation_recall(
            lambda r: GCPA(k, reg=r), cfg.gcpa_reg_grid, data.train, *v
        )
    return {
        "none": NoAlignment(k),
        "pairwise_procrustes": PairwiseProcrustes(k),
        "pairwise_cca": PairwiseCCA(k, reg=chosen["gcca"]),
        "gpa": GeneralizedProcrustes(k),
        "gcca": MultiviewCCA(k, reg=chosen["gcca"], method="maxvar"),
        "mcca_sumcor": MultiviewCCA(k, reg=chosen["mcca_sumcor"], method="sumcor"),
        "gcpa": GCPA(k, reg=cfg.gcpa_reg),
        "gcpa_tuned": GCPA(k, reg=chosen["gcpa_tuned"]),
        "gcpa_absolute": GCPA(k, reg=cfg.gcpa_absolute_reg, reg_scale="absolute"),
        "gcpa_extended": GCPA(k, reg=cfg.gcpa_reg),
        "oracle_gcca": MultiviewCCA(k, reg=chosen["gcca"], method="maxvar"),
    }


def _fit(name: str, model: Any, data: MultiViewData) -> Any:
    if name == "gcpa_extended":  # the universe of the first M - 1 models; the last one added with one map
        model.fit(data.train[:-1])
        model.add_view(data.train[-1])
        return model
    if name == "oracle_gcca":  # ceiling: fitted on the held-out items it is scored on
        return model.fit(data.test)
    return model.fit(data.train)


def gamma_sweep(data: MultiViewData, k: int, cfg: Config) -> dict[str, Any]:
    """GCPA's Recall@1 and distortion on the held-out items for every c of ``cfg.sweep`` (one GPA fit).

    Also returns where the first version's absolute gamma = 1e-3 falls on the relative axis (``absolute_c``).
    """
    base = GCPA(k, reg=cfg.gcpa_reg).fit(data.train)
    out: dict[str, Any] = {
        "c": list(cfg.sweep),
        "recall_at_1": [],
        "distortion": [],
        "absolute_c": cfg.gcpa_absolute_reg / (base.gamma_ / cfg.gcpa_reg),
    }
    for c in cfg.sweep:
        model = _with_reg(base, data.train, c)
        out["recall_at_1"].append(float(np.mean(any_to_any_ranks(model, data.test) < 1)))
        out["distortion"].append(geometry_distortion(model, data.test))
    return out


def evaluate(
    data: MultiViewData, k: int, cfg: Config
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, list[float]]]]:
    """Fit every arm on ``data``'s anchors and measure it on the held-out items.

    Returns ``(metrics, per_item)``: ``{arm: {metric: value}}`` and, for ``UNIT_ARMS``, ``{arm: {metric:
    [one value per held-out item]}}`` for Recall@1 and stitching accuracy (whose means are those metrics).
    """
    out: dict[str, dict[str, float]] = {}
    per_item: dict[str, dict[str, list[float]]] = {}
    p = data.name
    for name, model in make_arms(k, cfg, data).items():
        t0 = time.perf_counter()
        _fit(name, model, data)
        fit_s = time.perf_counter() - t0
        ranks = any_to_any_ranks(model, data.test)
        recall_1 = retrieval_per_item(ranks, 1)
        out[name] = {
            f"{p}_recall_at_1": float(recall_1.mean()),
            f"{p}_recall_at_5": float(np.mean(ranks < 5)),
            f"{p}_mrr": float(np.mean(1.0 / (ranks + 1))),
            f"{p}_distortion": geometry_distortion(model, data.test),
            f"{p}_fit_seconds": fit_s,
            f"{p}_maps": float(model.n_maps_),
        }
        if name in STITCHING_ARMS:
            stitching = stitching_correct(
                model, data.train, data.test, data.y_train, data.y_test, seed=cfg.seed
            ).mean(axis=0)
            out[name][f"{p}_stitching_accuracy"] = float(stitching.mean())
        if isinstance(model, GCPA):
            out[name][f"{p}_gamma"] = float(model.gamma_)
        if name in ("gcca", "mcca_sumcor", "gcpa_tuned"):
            out[name][f"{p}_chosen_reg"] = float(model.reg)
        if name in UNIT_ARMS:
            per_item[name] = {
                f"{p}_recall_at_1": recall_1.tolist(),
                f"{p}_stitching_accuracy": stitching.tolist(),
            }
            for metric in per_item[name]:  # the unit means are the metrics (set exactly, without round-off)
                del out[name][metric]
    return out, per_item


def run(cfg: Config) -> SeedRun:
    """One seed: build each embedded model set, fit all arms, return metrics per arm (prefixed by model set)."""
    metrics: dict[str, dict[str, float]] = {}
    items: dict[str, dict[str, list[float]]] = {}
    builders = {
        "digits": lambda: (digits_views(cfg.seed, steps=cfg.digits_steps), cfg.digits_components),
        "text": lambda: (text_views(cfg.seed, max_sentences=cfg.text_max_sentences), cfg.text_components),
        "tabular": lambda: (tabular_views(cfg.seed, max_iter=cfg.tabular_max_iter), cfg.tabular_components),
    }
    unknown = set(cfg.datasets) - set(builders)
    if unknown or not cfg.datasets:
        raise ValueError(
            f"datasets must be a non-empty subset of {sorted(builders)}, got {list(cfg.datasets)}"
        )
    sweep: dict[str, Any] = {}
    ids: dict[str, list[str]] = {}
    held_out: dict[str, list[str]] = {"train": [], "validation": []}
    held_by_set: dict[str, dict[str, list[str]]] = {}
    for name in progress([d for d in DATASETS if d in cfg.datasets], desc=f"gcpa seed {cfg.seed}"):
        data, k = builders[name]()
        ids[name], held = item_ids(data, cfg)
        held_by_set[name] = held
        for split, h in held.items():
            held_out[split] += h
        values, per_item = evaluate(data, k, cfg)
        for arm, ms in values.items():
            metrics.setdefault(arm, {}).update(ms)
        for arm, ms in per_item.items():
            items.setdefault(arm, {}).update(ms)
        sweep[name] = gamma_sweep(data, k, cfg)
    # the pooled units: every model set's held-out items, concatenated in DATASETS order
    for ms in items.values():
        for what in ("recall_at_1", "stitching_accuracy"):
            ms[f"all_{what}"] = [v for d in DATASETS if f"{d}_{what}" in ms for v in ms[f"{d}_{what}"]]
    note = (
        "GCPA here is this library's reconstruction of the correction (residual whitening); "
        "<mode>_gamma_sensitivity.png shows its Recall@1 over the whole range of c beside generalised CCA's, "
        "i.e. whether any correction strength would reach CCA on this model set"
    )
    notes = {cid: note for cid in ("tradeoff_retrieval", "retrieval_vs_cca")}
    notes.update({f"retrieval_{d}": note for d in cfg.datasets})
    # the ids of every per-item metric: the pooled all_* metrics list every model set's items (the unit's ids),
    # a per-set metric only its set's items (ids of its own, "arm.metric"); the held-out sets are keyed alike
    unit_ids: dict[str, list[str]] = {"items": [u for d in DATASETS if d in ids for u in ids[d]]}
    held: dict[str, dict[str, list[str]]] = {"items": held_out}
    for arm, ms in items.items():
        for metric in ms:
            d = metric.split("_", 1)[0]
            if d in ids:
                unit_ids[f"{arm}.{metric}"] = ids[d]
                held[f"{arm}.{metric}"] = held_by_set[d]
    series = {"gamma_sweep": sweep}
    return SeedRun(metrics, units={"items": items}, series=series, notes=notes, unit_ids=unit_ids, held_out=held)


def plot(runs: list[SeedRun], result: dict[str, Any], out_dir: Path) -> list[Path]:
    """Two figures: Recall@1 against distortion per method, and GCPA's gamma sensitivity, per model set."""
    datasets = [d for d in DATASETS if d in result["config"]["datasets"]]
    arms = result["arms"]
    fig, axes = new_figure(1, len(datasets), squeeze=False)
    for ax, name in zip(axes[0], datasets, strict=True):
        for arm, m in arms.items():
            if f"{name}_distortion" not in m:
                continue
            x, y = m[f"{name}_distortion"]["mean"], m[f"{name}_recall_at_1"]["mean"]
            ax.scatter([x], [y], s=30)
            ax.annotate(arm, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel("geometry distortion (0 = isometry)")
        ax.set_ylabel("any-to-any Recall@1")
        ax.set_title(f"{name}: mean over seeds {result['seeds']}", fontsize=9)
    paths = [save_figure(fig, out_dir / f"{result['mode']}_retrieval_vs_distortion.png")]

    fig, axes = new_figure(2, len(datasets), squeeze=False, sharex=True)
    for j, name in enumerate(datasets):
        sweeps = [r.series["gamma_sweep"][name] for r in runs if name in r.series.get("gamma_sweep", {})]
        if not sweeps:
            continue
        c = np.asarray(sweeps[0]["c"])
        for i, (key, label) in enumerate(
            (("recall_at_1", "any-to-any Recall@1"), ("distortion", "geometry distortion"))
        ):
            ax = axes[i][j]
            vals = np.asarray([s[key] for s in sweeps])
            ax.errorbar(
                c,
                vals.mean(0),
                yerr=vals.std(0, ddof=1) if len(vals) > 1 else None,
                marker="o",
                ms=3,
                label="GCPA, gamma = c tr(Sigma_w)/k",
            )
            metric = f"{name}_{key}"
            for arm, style in (("gpa", ":"), ("gcca", "--")):
                if metric in arms.get(arm, {}):
                    ax.axhline(arms[arm][metric]["mean"], ls=style, color="grey", lw=1, label=arm)
            ax.axvline(1.0, color="k", lw=0.6, alpha=0.5)
            abs_c = float(np.mean([s["absolute_c"] for s in sweeps]))
            ax.axvline(abs_c, color="tab:red", lw=0.8, ls="-.", label="absolute gamma 1e-3 (first version)")
            ax.set_xscale("log")
            ax.set_ylabel(label)
            if i == 0:
                ax.set_title(f"{name} ({len(sweeps)} seeds; c = 1 default)", fontsize=9)
            else:
                ax.set_xlabel("c (relative ridge)")
        axes[0][j].legend(fontsize=6)
    paths.append(save_figure(fig, out_dir / f"{result['mode']}_gamma_sensitivity.png"))
    return paths
