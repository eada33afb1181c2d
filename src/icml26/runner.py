"""``icml26 reproduce``: run a paper's experiment over seeds, decide its claims, write the result JSON.

An experiment module ``icml26.<slug>.experiment`` provides:

- ``Config``: a dataclass with a ``seed: int`` field (and a docstring under each field);
- ``PRESETS: dict[str, Config]`` with keys ``smoke``, ``quick``, ``full``;
- ``run(cfg: Config) -> SeedRun``: one seed's metrics ``{arm: {metric: float}}``;
- optionally ``plot(runs: list[SeedRun], result: dict, out_dir: Path) -> list[Path]`` writing PNG files
  named ``<mode>_<what>.png`` (``result["mode"]``) so that modes do not overwrite each other.

The runner checks that ``<out>/<slug>`` is writable, seeds everything, sets one torch thread (or
``cfg.threads``), runs every seed, aggregates mean ± std, decides each of the card's claims for this mode with
its check, and writes ``<out>/<slug>/<mode>.json`` atomically. Nothing else writes result files. When a run
stops early (an error, Ctrl-C), the seeds that finished are kept in ``<mode>.partial.json`` with
``"complete": false``, which the report never reads as a result.

Example (a planned paper cannot be reproduced):
    >>> import dataclasses
    >>> from icml26.registry import get_paper
    >>> planned = dataclasses.replace(get_paper("fedit"), status="planned")
    >>> try:
    ...     run_paper(planned, mode="smoke", out_dir="/tmp/unused")
    ... except NotImplementedPaperError as exc:
    ...     print(type(exc).__name__)
    NotImplementedPaperError
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import importlib
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from .common.claims import RULES, ours_text
from .common.optional import install_hint
from .common.progress import progress
from .common.repro import environment, provenance, seed_everything, set_threads
from .common.results import MODES, SeedRun, aggregate_arms, aggregate_ids, write_result
from .registry import Claim, Paper, missing_extras


class ReproduceError(RuntimeError):
    """A reproduction cannot run or its experiment broke the contract; the message says why."""


class NotImplementedPaperError(ReproduceError):
    """The paper's card says ``status = "planned"``."""


class MissingExtrasError(ReproduceError):
    """An extra the paper needs is not installed; the message names the pip command."""


def load_experiment(paper: Paper) -> ModuleType:
    """Import ``icml26.<slug>.experiment`` and check it follows the experiment contract."""
    module = importlib.import_module(f"icml26.{paper.slug}.experiment")
    check_experiment_module(module, paper.slug)
    return module


def check_experiment_module(module: ModuleType, slug: str) -> None:
    """Raise ``ReproduceError`` unless ``module`` has ``Config``, ``PRESETS`` (all modes) and ``run``."""
    config = getattr(module, "Config", None)
    if config is None or not dataclasses.is_dataclass(config):
        raise ReproduceError(f"{slug}: experiment.Config must be a dataclass")
    if "seed" not in {f.name for f in dataclasses.fields(config)}:
        raise ReproduceError(f"{slug}: experiment.Config needs a 'seed' field")
    presets = getattr(module, "PRESETS", None)
    if not isinstance(presets, dict) or set(presets) != set(MODES):
        raise ReproduceError(f"{slug}: experiment.PRESETS must have exactly the keys {MODES}")
    if not all(isinstance(p, config) for p in presets.values()):
        raise ReproduceError(f"{slug}: every PRESETS value must be an experiment.Config")
    if not callable(getattr(module, "run", None)):
        raise ReproduceError(f"{slug}: experiment.run(cfg) -> SeedRun is missing")


def _jsonable_config(cfg: Any) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(cfg):
        if f.name == "seed":
            continue
        value = getattr(cfg, f.name)
        if isinstance(value, Path):
            value = str(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def claim_entry(claim: Claim, arms: dict[str, Any], notes: Sequence[str] = (),
                unit_ids: dict[str, Any] | None = None, *, rules: int = RULES) -> dict[str, Any]:
    """The result JSON's entry for ``claim`` decided on ``arms`` (what ``icml26 report --check`` recomputes).

    ``rules=3`` gives the entry of a result written under verdicts v3 (see ``Check.evaluate``).

    Raises:
        KeyError, ValueError: the check does not fit the arms (see ``Check.evaluate``).
    """
    outcome = claim.check.evaluate(arms, unit_ids, rules=rules)
    entry = {"id": claim.id, "text": claim.text, "check": claim.check.text, "kind": claim.kind,
             "min_effect_why": claim.min_effect_why, "paper": claim.paper.as_dict(),
             "ours": ours_text(claim.check, arms, outcome), **outcome.as_dict()}
    entry["notes"] = list(notes)
    entry["direction"] = claim.direction
    entry["headline"] = claim.headline
    return entry


def decide_claim(paper: Paper, claim: Claim, arms: dict[str, Any], runs: Sequence[SeedRun],
                 unit_ids: dict[str, Any] | None = None) -> dict[str, Any]:
    notes = sorted({r.notes[claim.id] for r in runs if claim.id in r.notes})
    try:
        return claim_entry(claim, arms, notes, unit_ids)
    except (KeyError, ValueError) as exc:
        raise ReproduceError(f"{paper.slug}: claim {claim.id!r}: {exc.args[0]}") from exc


def headline_entry(paper: Paper, claims: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The headline's verdict and whether this world can decide it: every precondition of the mode that gates
    it (those without ``gates``, and any naming it) holds."""
    head = next((c for c in claims if c["id"] == paper.headline.id), None)
    if head is None:
        return None
    gating = {c.id for c in paper.claims if c.gated(head["id"], paper.headline.id)}
    pre = {c["id"]: c["verdict"] for c in claims if c["kind"] == "precondition" and c["id"] in gating}
    return {"id": head["id"], "verdict": head["verdict"], "preconditions": pre,
            "decidable": all(v == "holds" for v in pre.values())}


def gated_entries(paper: Paper, claims: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{claim id: {"preconditions": {id: verdict}, "decidable": bool}}`` for every evidence claim of the result,
    other than the headline, that a scoped precondition (one with ``gates``) names: decidable only where each of
    them holds; a precondition not run in this mode reads ``"not run"``. Empty for a card without scoped gates
    (its result then has no ``gated`` entry)."""
    verdicts = {c["id"]: c["verdict"] for c in claims}
    out: dict[str, dict[str, Any]] = {}
    for cid in verdicts:
        if cid == paper.headline.id:
            continue
        pre = {c.id: verdicts.get(c.id, "not run") for c in paper.claims if c.gated(cid, paper.headline.id)}
        if pre:
            out[cid] = {"preconditions": pre, "decidable": all(v == "holds" for v in pre.values())}
    return out


def _assemble(paper: Paper, mode: str, seeds: Sequence[int], cfg: Any, runs: Sequence[SeedRun],
              prov: dict[str, Any], env: dict[str, Any], wall_s: float, *, complete: bool) -> dict[str, Any]:
    try:
        arms = aggregate_arms(runs)
        unit_ids, overlap = aggregate_ids(runs)
    except ValueError as exc:
        raise ReproduceError(f"{paper.slug}: {exc}") from exc
    leaks = {f"{u}/{split}": counts for u, splits in overlap.items() for split, counts in splits.items()
             if any(counts)}
    if leaks:
        raise ReproduceError(f"{paper.slug}: test units are also training or validation units (per seed: "
                             f"{leaks}); held-out units must be disjoint from them")
    claims = [decide_claim(paper, claim, arms, runs, unit_ids) for claim in paper.claims_for(mode)]
    out = {
        "slug": paper.slug, "mode": mode, "seeds": list(seeds), "config": _jsonable_config(cfg),
        "arms": arms, "claims": claims, "provenance": prov, "env": env, "complete": complete,
        "wall_s": round(wall_s, 3), "created": _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat(),
        "rules": RULES, "unit_ids": unit_ids, "overlap": overlap,
    }
    head = headline_entry(paper, claims)
    if head is not None:
        out["headline"] = head
    gated = gated_entries(paper, claims)
    if gated:
        out["gated"] = gated
    return out


def check_writable(out_dir: str | Path) -> Path:
    """Prove that files can be written under ``out_dir`` (a probe file in its nearest existing ancestor,
    removed at once; nothing is created); raise ``OSError`` naming the directory otherwise."""
    path = Path(out_dir)
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        if not probe.is_dir():
            raise NotADirectoryError(20, f"{probe} is not a directory")
        with tempfile.NamedTemporaryFile(dir=probe, prefix=".icml26-write-test."):
            pass
    except OSError as exc:
        raise OSError(f"cannot write results under {path}: {exc.strerror or exc}") from exc
    return path


def run_paper(paper: Paper, mode: str = "quick", seeds: Sequence[int] | None = None,
              out_dir: str | Path = "results", experiment: ModuleType | None = None,
              show_progress: bool = True) -> dict[str, Any]:
    """Reproduce ``paper`` in ``mode`` over ``seeds`` and write ``<out_dir>/<slug>/<mode>.json``.

    Args:
        paper: the card (``icml26.registry.get_paper(slug)``).
        mode: ``smoke``, ``quick`` or ``full``.
        seeds: seeds to run (default: the card's seeds for ``mode``).
        out_dir: results root; the JSON goes to ``out_dir/<slug>/<mode>.json``, plots beside it.
        experiment: an experiment module to use instead of ``icml26.<slug>.experiment`` (tests).
        show_progress: draw a bar over seeds (still silent when not a terminal).

    Returns:
        The result dict that was written.

    Raises:
        NotImplementedPaperError, MissingExtrasError, ReproduceError, ValueError (bad mode or seeds).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if experiment is None and not paper.implemented:
        raise NotImplementedPaperError(
            f"{paper.slug} is not implemented yet (status: planned); see `icml26 info {paper.slug}`"
            + (f" and issue #{paper.issue}" if paper.issue else "")
        )
    missing = missing_extras(paper)
    if missing:
        lines = "; ".join(f"extra {e!r} lacks {', '.join(d)}" for e, d in missing.items())
        raise MissingExtrasError(
            f"{paper.slug} needs optional dependencies that are not installed ({lines}); install them with: "
            + " && ".join(install_hint(e) for e in missing)
        )
    seeds = list(paper.modes[mode].seeds if seeds is None else seeds)
    if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds):
        raise ValueError(f"seeds must be a non-empty list of non-negative ints, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct, got {seeds!r}")

    check_writable(Path(out_dir) / paper.slug)
    exp = experiment if experiment is not None else load_experiment(paper)
    if experiment is not None:
        check_experiment_module(exp, paper.slug)
    base_cfg = exp.PRESETS[mode]
    set_threads(int(getattr(base_cfg, "threads", 1)))

    env = environment()                     # the checkout as the run starts (edits made meanwhile do not count)
    prov = provenance(paper.slug, paper.path, paper.folder.parent)
    target_dir = Path(out_dir) / paper.slug
    t0 = time.perf_counter()
    runs: list[SeedRun] = []
    bar = progress(seeds, desc=f"{paper.slug} {mode}") if show_progress else seeds
    try:
        for seed in bar:
            cfg = dataclasses.replace(base_cfg, seed=seed)
            seed_everything(seed)
            run = exp.run(cfg)
            if not isinstance(run, SeedRun):
                raise ReproduceError(f"{paper.slug}: experiment.run must return a SeedRun, got {type(run).__name__}")
            bad = [f"{a}.{m}" for a, ms in run.metrics.items() for m, v in ms.items() if not math.isfinite(v)]
            if bad:
                print(f"warning: {paper.slug} seed {seed}: non-finite metrics {bad}", file=sys.stderr)
            runs.append(run)
    except BaseException as exc:
        # keep the seeds that finished, in a file the report never reads as a result
        if runs and not isinstance(exc, ReproduceError):
            partial = _assemble(paper, mode, seeds[: len(runs)], base_cfg, runs, prov, env,
                                time.perf_counter() - t0, complete=False)
            path = target_dir / f"{mode}.partial.json"
            with contextlib.suppress(OSError, ReproduceError):
                write_result(path, partial)
                exc.partial_result = path  # type: ignore[attr-defined]
        raise
    wall_s = time.perf_counter() - t0
    result = _assemble(paper, mode, seeds, base_cfg, runs, prov, env, wall_s, complete=True)
    write_result(target_dir / f"{mode}.json", result)
    with contextlib.suppress(FileNotFoundError):
        (target_dir / f"{mode}.partial.json").unlink()
    plot = getattr(exp, "plot", None)
    if callable(plot):
        plot(runs, result, target_dir)
    budget = paper.modes[mode].budget_s
    if wall_s > budget:
        print(f"warning: {paper.slug} {mode} took {wall_s:.1f} s, over its budget of {budget:.0f} s",
              file=sys.stderr)
    return result
