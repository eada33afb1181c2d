"""SARL's learning-rate and budget pilot (issue #53 items 1 and 3): every learned arm's rate chosen on validation
scenarios over two training draws, then the budget checked by training twice as long.

The rule it serves was committed before the pilot ran (``src/icml26/sarl/README.md``, Deviation 10):

* every learned arm trains with the learning rate decaying linearly to zero (``lr_end_frac = 0``);
* stage A: each arm trains at every rate of ``GRID`` on seeds 7 and 8 (outside quick's and full's seeds), with the
  full preset's settings; its score is greedy success on the 32 validation scenarios after training, averaged over
  the two seeds; the highest score wins, ties to the smaller rate, and a choice on an edge extends the grid once past
  it (``common.bracketing.tune_bracketed``); still on an edge is flagged;
* stage B: each arm trains at its chosen rate for twice full's budget (the schedule over the whole budget) on the
  same seeds; full's budget doubles when some learned arm's mean validation success at the end of stage B beats its
  stage-A score by more than ``CURVE_TOL`` (2 of 32 scenarios), and stays otherwise.

The test evaluation is cut to one episode at one scale (the pilot never reads test scenarios). Run (about 30
minutes on two cores; writes ``results/sarl/lr_pilot.json``)::

    .venv/bin/python scripts/sarl_lr_pilot.py
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import time
from pathlib import Path
from typing import Any

import numpy as np

from icml26.common.bracketing import tune_bracketed
from icml26.common.io import atomic_write_text
from icml26.common.repro import git_revision
from icml26.sarl.experiment import CURVE_TOL, LEARNED_ARMS, PRESETS, Config

ROOT = Path(__file__).resolve().parents[1]
SEEDS = (7, 8)
GRID = (1e-4, 3e-4, 1e-3, 3e-3)
#: full's budget when the pilot ran (the presets now hold the pilot's outcome: its rates and, by its rule, 48k)
BUDGET = 24_000
EXTEND = 1


def _base(seed: int) -> Config:
    full = PRESETS["full"]
    return dataclasses.replace(
        full, seed=seed, curve_seed=seed, budget=BUDGET, arm_lr=(), arm_lr_edge=(), lr_end_frac=0.0,
        eval_episodes=1, eval_episodes_scales=1, scales=(),
    )


def _job(job: tuple[str, int, Any]) -> tuple[str, int, Any, dict[str, list]]:
    """One training run of every learned arm; returns its validation curves."""
    import torch

    from icml26.sarl.experiment import run

    torch.set_num_threads(1)
    stage, seed, arg = job
    if stage == "A":  # every arm at one rate, full's budget, curve points at half and the end
        cfg = dataclasses.replace(_base(seed), lr=float(arg), curve_points=2)
    else:  # every arm at its chosen rate, twice full's budget, 6 curve points
        cfg = dataclasses.replace(_base(seed), arm_lr=tuple(arg), budget=2 * _base(seed).budget, curve_points=6)
    return stage, seed, arg, run(cfg).series["val_curves"]


def _key(lr: float) -> str:
    return f"{lr:.6g}"


def main() -> None:
    t0 = time.time()
    ctx = multiprocessing.get_context("spawn")
    curves: dict[tuple[str, int], dict[str, list]] = {}
    with ctx.Pool(2) as pool:

        def stage_a(rates: list[float]) -> None:
            jobs = [("A", s, r) for r in rates for s in SEEDS if (_key(r), s) not in curves]
            for _, seed, r, c in pool.imap_unordered(_job, jobs):
                curves[(_key(r), seed)] = c
                print(f"A seed {seed} lr {r:g}: " + ", ".join(f"{a} {c[a][-1][1]:.3f}" for a in LEARNED_ARMS))

        def score(arm: str, lr: float) -> float:
            # validation success after training, averaged over the two draws
            return float(np.mean([curves[(_key(lr), s)][arm][-1][1] for s in SEEDS]))

        stage_a(list(GRID))
        # the values a first choice on an edge would add (tune_bracketed's rule: the grid's first ratio past it)
        ratio = GRID[1] / GRID[0]
        extra = set()
        for arm in LEARNED_ARMS:
            first, _ = tune_bracketed(GRID, lambda v, arm=arm: (score(arm, v), None), 0)
            if first["at_edge"]:
                extra.add(GRID[0] / ratio if first["chosen"] == GRID[0] else GRID[-1] * ratio)
        stage_a(sorted(extra))
        tuning = {
            arm: tune_bracketed(GRID, lambda v, arm=arm: (score(arm, v), None), EXTEND)[0] for arm in LEARNED_ARMS
        }
        chosen = tuple((arm, float(tuning[arm]["chosen"])) for arm in LEARNED_ARMS)
        stage_b = {seed: c for _, seed, _, c in pool.imap_unordered(_job, [("B", s, chosen) for s in SEEDS])}
    budget = BUDGET
    end_a = {arm: score(arm, dict(chosen)[arm]) for arm in LEARNED_ARMS}
    end_b = {arm: float(np.mean([stage_b[s][arm][-1][1] for s in SEEDS])) for arm in LEARNED_ARMS}
    gains = {arm: end_b[arm] - end_a[arm] for arm in LEARNED_ARMS}
    # the budget rule: double when some arm gains more than CURVE_TOL from twice the training
    double = any(g > CURVE_TOL + 1e-12 for g in gains.values())
    sha, dirty = git_revision(ROOT)
    out = {
        "seeds": list(SEEDS), "grid": list(GRID), "extend": EXTEND, "lr_end_frac": 0.0, "tolerance": CURVE_TOL,
        "tuning": tuning, "chosen": dict(chosen),
        "stage_a_val_success": {arm: {_key(r): [curves[(_key(r), s)][arm][-1][1] for s in SEEDS]
                                      for r in sorted({float(k) for k, _ in curves})} for arm in LEARNED_ARMS},
        "stage_a_end": end_a, "stage_b_end": end_b, "stage_b_gain": gains,
        "stage_b_curves": {str(s): stage_b[s] for s in SEEDS},
        "full_budget_before": budget, "full_budget_after": 2 * budget if double else budget,
        "wall_s": round(time.time() - t0, 1), "git_sha": sha, "src_clean": dirty is False,
    }
    atomic_write_text(ROOT / "results" / "sarl" / "lr_pilot.json", json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("chosen", "stage_a_end", "stage_b_end", "full_budget_after")}, indent=1))


if __name__ == "__main__":
    main()
