"""Align-TI's stage-2 budget pilot (issue #54 item 3): the smallest budget at which vanilla KD leaves the stage-1
start on every question family, within what the full preset can afford.

The rule it serves was written before the pilot ran (``src/icml26/align_ti/README.md``, Deviation 13;
``experiment.stage2_budget_choice``):

* the budgets: the doubling grid ``experiment.STAGE2_BUDGETS`` (200, 400, 800, 1600);
* affordable: full's estimated stage-2 training at B (every full arm on every full seed, the compute-matched arms'
  extra steps included, each arm's CPU seconds per step measured here over ``TIME_STEPS`` steps, one thread: process
  time, which other jobs' load does not move) at most
  ``experiment.STAGE2_TIME_CAP_S`` (800 s of full's 900 s); 200, the budget before the rule, always is;
* at each affordable budget, smallest first: vanilla KD's learning rate chosen on its bracketed validation grid at
  that budget (``experiment.tune_arm``, cached: the reproduction reuses it), and its validation exact match per
  family at that rate; the first budget at which every family is at or above the stage-1 checkpoint's validation
  exact match is the choice; none: the largest affordable budget, ``met`` false.

Only validation questions, the stage-1 checkpoint and the lab seed's training draws are read, never a test question.
Run (a few minutes on one core with the lab models cached; writes ``results/align_ti/stage2_pilot.json``)::

    .venv/bin/python scripts/align_ti_stage2_pilot.py
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import torch

from icml26.align_ti import experiment as ex
from icml26.common.io import atomic_write_text
from icml26.common.repro import git_revision
from icml26.registry import get_paper

ROOT = Path(__file__).resolve().parents[1]
#: steps timed per objective for the per-step cost
TIME_STEPS = 30
#: objectives timed; the compute-matched arms are vanilla KD steps
TIMED = ("sft", "vanilla_kd", "gkd", "kd_iva", "kd_tpa", "align_ti")


def per_step_seconds(cfg: ex.Config, parts: tuple) -> dict[str, float]:
    """CPU seconds (process time) per stage-2 step of every full arm, over ``TIME_STEPS`` steps (lab seed's
    draws)."""
    short = dataclasses.replace(cfg, steps=TIME_STEPS)
    out = {}
    for arm in TIMED:
        c0 = time.process_time()
        ex.train_arm(arm, short, 2e-3, 20_000 + cfg.lab_seed, parts)
        out[arm] = (time.process_time() - c0) / TIME_STEPS
    for arm in ex.MORE_KD:
        out[arm] = out["vanilla_kd"]
    return out


def main() -> None:
    torch.set_num_threads(1)
    t0 = time.time()
    full = ex.PRESETS["full"]
    teacher, student0, tok = ex.teacher_and_student(full)
    layer, _ = ex.iva_layer(full, teacher, tok)
    parts = (teacher, student0, tok, layer)
    n_seeds = len(get_paper("align_ti").modes["full"].seeds)
    per_step = per_step_seconds(full, parts)
    ratio = ex.compute_ratio(full, parts)
    estimate = {b: ex.full_training_estimate(full, per_step, ratio, n_seeds, b) for b in ex.STAGE2_BUDGETS}
    affordable = [b for b in ex.STAGE2_BUDGETS if b == ex.STAGE2_BUDGETS[0] or estimate[b] <= ex.STAGE2_TIME_CAP_S]
    print(f"seconds per step {json.dumps({a: round(v, 4) for a, v in per_step.items()})}; FLOP ratio {ratio:.3f}")
    print(f"full's estimated stage-2 training: {json.dumps({b: round(v) for b, v in estimate.items()})}; "
          f"affordable {affordable}")
    start = ex.stage1_by_family(full, parts)
    print(f"stage-1 start (validation exact match per family): {start}")
    by_budget, tuning = {}, {}
    for budget in affordable:
        cfg = dataclasses.replace(full, steps=budget)
        tuning[budget] = ex.tune_arm(cfg, "vanilla_kd", parts)
        by_budget[budget] = ex.validation_record(cfg, "vanilla_kd", tuning[budget]["lr"], parts)["val_by_family"]
        print(f"B={budget}: lr {tuning[budget]['lr']:g} (at edge {tuning[budget]['at_edge']}), {by_budget[budget]}")
        if all(by_budget[budget][f] >= start[f] for f in start):
            break
    decision = ex.stage2_budget_choice(start, by_budget, affordable)
    sha, dirty = git_revision(ROOT)  # dirty: code (src/, pyproject.toml) differs from the commit
    out = {
        "rule": "README Deviation 13", "budgets": list(ex.STAGE2_BUDGETS), "time_cap_s": ex.STAGE2_TIME_CAP_S,
        "time_steps": TIME_STEPS, "per_step_s": per_step, "flop_ratio": ratio, "n_full_seeds": n_seeds,
        "full_training_estimate_s": {str(b): v for b, v in estimate.items()}, "affordable": affordable,
        "stage1_start": start, "vanilla_kd_by_budget": {str(b): v for b, v in by_budget.items()},
        "vanilla_kd_tuning": {str(b): v for b, v in tuning.items()}, "steps_before": full.steps,
        "steps": decision["steps"], "met": decision["met"], "n_val": full.n_val,
        "wall_s": round(time.time() - t0, 1), "git_sha": sha, "src_clean": dirty is False,
    }
    atomic_write_text(ROOT / "results" / "align_ti" / "stage2_pilot.json", json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("steps", "met", "affordable")}))


if __name__ == "__main__":
    main()
