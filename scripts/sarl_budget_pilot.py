"""SARL's budget pilot (issue #53 item 3): every learned arm's validation learning curve to 4x full's budget.

The rule it serves was committed before the pilot was read (``src/icml26/sarl/README.md``, Deviation 9): full's
budget is the smallest curve point B at which every learned arm's validation success is within 2 of 32 scenarios of
its value at B - 12k, within full's 900 s. The pilot uses seed 7, outside quick's and full's seeds, and the full
preset's settings otherwise (32 validation scenarios per point, 8 points to 96k agent-samples).

Run (about 6 minutes on one core; writes ``results/sarl/budget_pilot.json``)::

    .venv/bin/python scripts/sarl_budget_pilot.py
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import torch

from icml26.common.io import atomic_write_text
from icml26.common.repro import git_revision
from icml26.sarl.experiment import CURVE_TOL, PRESETS, curve_flattened, run

ROOT = Path(__file__).resolve().parents[1]
SEED, POINTS, SCALE = 7, 8, 4


def first_flat_point(curves: dict[str, list[list[float]]], tol: float = CURVE_TOL) -> float | None:
    """The smallest curve point (agent-samples of the first learned arm) at which every learned arm's validation
    success moved by at most ``tol`` since its previous point; None when no point qualifies.

    Example:
        >>> first_flat_point({"a": [[1, 0.5], [2, 0.5]], "b": [[1, 0.1], [2, 0.3]]}, 0.0625) is None
        True
    """
    arms = [c for n, c in curves.items() if n != "greedy_kss"]
    for k in range(1, min(len(c) for c in arms)):
        if all(curve_flattened(c[: k + 1], tol) for c in arms):     # the result's own flattened rule
            return arms[0][k][0]
    return None


def main() -> None:
    torch.set_num_threads(1)
    # full as it was when this pilot ran (24k agent-samples, every arm at 1e-3, constant): the presets have since
    # taken the learning-rate pilot's rates, schedule and budget (scripts/sarl_lr_pilot.py, README Deviation 10)
    full = dataclasses.replace(PRESETS["full"], budget=24_000, lr=1e-3, arm_lr=(), arm_lr_edge=(), lr_end_frac=1.0)
    cfg = dataclasses.replace(full, seed=SEED, curve_seed=SEED, budget=SCALE * full.budget, curve_points=POINTS)
    t0 = time.time()
    result = run(cfg)
    curves = result.series["val_curves"]
    sha, dirty = git_revision(ROOT)  # dirty: code (src/, pyproject.toml) differs from the commit
    out = {"seed": SEED, "budget": cfg.budget, "curve_points": POINTS, "curve_episodes": cfg.curve_episodes,
           "tolerance": CURVE_TOL, "full_budget": full.budget, "first_flat_point": first_flat_point(curves),
           "val_curves": curves, "notes": result.notes, "wall_s": round(time.time() - t0, 1), "git_sha": sha,
           "src_clean": dirty is False}
    path = ROOT / "results" / "sarl" / "budget_pilot.json"
    atomic_write_text(path, json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "val_curves"}, indent=1))


if __name__ == "__main__":
    main()
