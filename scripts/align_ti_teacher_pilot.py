"""Align-TI's teacher pilot (issue #54 item 1): the teacher's stage-1 and stage-2 learning rates, each chosen on
its own bracketed validation grid, so that the teacher is strong on every question family.

The rule it serves was written before the pilot ran (``src/icml26/align_ti/README.md``, Deviation 17):

* draws: lab seeds ``DRAWS`` (0, 1) of the full preset's teacher recipe (each its own encoder, initialisation,
  training streams and validation questions, ``experiment.validation_set``); the presets' teacher stays lab seed 0;
* stage 1 first: ``stage1_lr`` on ``STAGE1_GRID`` (7.5e-4, 1.5e-3, 3e-3), score: minus the stage-1 teacher's
  validation loss on the patch descriptions (mean cross-entropy per answer token, ``</s>`` included, teacher
  forcing), averaged over the draws;
* then stage 2, from each draw's chosen stage-1 checkpoint: ``stage2_lr`` on ``STAGE2_GRID`` (2.5e-4, 5e-4, 1e-3,
  2e-3), score: the teacher's validation exact match averaged over the families (object, patch, count) and the
  draws; the stage-2 budget stays ``teacher_steps`` (1500);
* both bracketed (``common.bracketing.tune_bracketed``): an edge choice adds one rate past that edge (the grid's
  ratio), ``EXTEND`` (1) time; a choice still on an edge is flagged; ties go to the smaller rate.

Stage 1 is the lab's (``lab_vlm`` of the recipe without stage 2, cached); stage 2 is ``lab_vlm``'s stage 2 run on a
copy of it, so every stage-2 rate shares the stage-1 checkpoint. At the end the chosen lab-seed-0 teacher is built
by ``lab_vlm`` itself (cached: the reproduction reuses it) and compared with the pilot's, weight for weight
(``matches_lab_vlm``). Only validation questions and the lab's training draws are read, never a test question.
Run (about 40 minutes on one core, plus about 5 for the final build; writes ``results/align_ti/teacher_pilot.json``)::

    .venv/bin/python scripts/align_ti_teacher_pilot.py

``--smoke`` runs the same code on the smoke preset's tiny teacher (a check of the script, not a choice) and writes
to the temporary directory unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from icml26.align_ti import experiment as ex
from icml26.common.bracketing import tune_bracketed
from icml26.common.io import atomic_write_text
from icml26.common.repro import git_revision
from icml26.common.tiny_vlm import IGNORE_INDEX, LabRecipe, instruction_sampler, lab_vlm, train_vlm

ROOT = Path(__file__).resolve().parents[1]
#: lab seeds of the draws every rate is scored on
DRAWS = (0, 1)
#: the teacher's stage-1 rates (the lab's 3e-3 on top)
STAGE1_GRID = (7.5e-4, 1.5e-3, 3e-3)
#: the teacher's stage-2 rates (the lab's 2e-3 on top)
STAGE2_GRID = (2.5e-4, 5e-4, 1e-3, 2e-3)
#: rates added past an edge choice, per grid
EXTEND = 1


def teacher_recipe(cfg: ex.Config, stage1_lr: float, stage2_lr: float | None = None) -> LabRecipe:
    """``experiment.teacher_recipe`` with the teacher's rates replaced (``stage2_lr`` None: the preset's)."""
    rates = {"stage1_lr": float(stage1_lr)} | ({} if stage2_lr is None else {"stage2_lr": float(stage2_lr)})
    return dataclasses.replace(ex.teacher_recipe(cfg), **rates)


def stage1_teacher(cfg: ex.Config, stage1_lr: float) -> tuple[Any, Any]:
    """``(model, tokenizer)``: the teacher after the lab's stages 0 and 1 at ``stage1_lr`` (cached)."""
    rec = teacher_recipe(cfg, stage1_lr)
    model, tok = lab_vlm(dataclasses.replace(rec, stage2_steps=0), desc=None)
    model.set_attn_implementation(rec.spec.attn_implementation)  # a reloaded lab model is sdpa; lab_vlm trains eager
    return model, tok


def stage2_teacher(model0: Any, tok: Any, rec: LabRecipe) -> Any:
    """``lab_vlm``'s stage 2 of ``rec`` on a copy of the stage-1 checkpoint ``model0`` (``matches_lab_vlm`` checks
    that this is ``lab_vlm``'s teacher)."""
    model = copy.deepcopy(model0)
    return train_vlm(model, instruction_sampler(tok, rec.scenes, rec.stage2_families, rec.batch_size),
                     steps=rec.stage2_steps, trainable="projector+lm", lr=rec.stage2_lr, seed=rec.seed + 2, desc=None)


def validation_scores(cfg: ex.Config, model: Any, tok: Any) -> dict[str, dict[str, float]]:
    """``{"exact_match", "loss"}``, each per family: the model's exact match (``experiment.evaluate``) and mean
    cross-entropy per answer token (teacher forcing) on ``cfg``'s validation questions."""
    val = ex.validation_set(cfg)
    seed = 20_000 + cfg.lab_seed  # the rendering seed of the experiment's validation runs
    out = ex._logits_and_batches(model, tok, cfg, val, seed)
    exact = ex.evaluate(model, [lg for _, lg in out], tok, cfg, val, seed)["exact_match"]
    loss = []
    for batch, logits in out:
        target = batch["labels"][:, 1:]
        mask = target != IGNORE_INDEX
        ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target.clamp(min=0), reduction="none")
        loss.append(((ce * mask).sum(-1) / mask.sum(-1).clamp(min=1)).numpy())
    return {"exact_match": ex.by_family(exact, val.items), "loss": ex.by_family(np.concatenate(loss), val.items)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="the smoke preset's tiny teacher (a script check)")
    parser.add_argument("--out", type=Path, default=None, help="output JSON")
    args = parser.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    base = ex.PRESETS["smoke" if args.smoke else "full"]
    out_path = args.out or (Path(tempfile.gettempdir()) / "align_ti_teacher_pilot_smoke.json" if args.smoke
                            else ROOT / "results" / "align_ti" / "teacher_pilot.json")
    cfgs = {d: dataclasses.replace(base, lab_seed=d) for d in DRAWS}
    stage1: dict[float, dict[int, Any]] = {}
    stage2: dict[float, dict[int, Any]] = {}

    def stage1_score(lr: float) -> tuple[float, None]:
        stage1[lr] = {}
        for d, cfg in cfgs.items():
            c0 = time.process_time()
            model, tok = stage1_teacher(cfg, lr)
            stage1[lr][d] = {**validation_scores(cfg, model, tok), "cpu_s": round(time.process_time() - c0, 1)}
        score = -float(np.mean([stage1[lr][d]["loss"]["patch"] for d in DRAWS]))
        print(f"stage 1, lr {lr:g}: patch loss {-score:.4f}; {json.dumps(stage1[lr])}", flush=True)
        return score, None

    rec1, _ = tune_bracketed(STAGE1_GRID, stage1_score, EXTEND)
    s1 = float(rec1["chosen"])
    start = {d: stage1_teacher(cfg, s1) for d, cfg in cfgs.items()}

    def stage2_score(lr: float) -> tuple[float, dict[str, torch.Tensor]]:
        stage2[lr], art = {}, None
        for d, cfg in cfgs.items():
            c0 = time.process_time()
            model = stage2_teacher(*start[d], teacher_recipe(cfg, s1, lr))
            stage2[lr][d] = {**validation_scores(cfg, model, start[d][1]),
                             "cpu_s": round(time.process_time() - c0, 1)}
            if d == 0:
                art = {k: v.clone() for k, v in model.state_dict().items()}
        score = float(np.mean([np.mean(list(stage2[lr][d]["exact_match"].values())) for d in DRAWS]))
        print(f"stage 2, lr {lr:g}: mean exact match {score:.4f}; {json.dumps(stage2[lr])}", flush=True)
        return score, art

    rec2, chosen_weights = tune_bracketed(STAGE2_GRID, stage2_score, EXTEND)
    s2 = float(rec2["chosen"])
    matches = None
    if 0 in DRAWS:  # the presets' teacher (lab seed 0) at the chosen rates, built by lab_vlm itself (cached)
        c0 = time.process_time()
        teacher, _ = lab_vlm(teacher_recipe(cfgs[0], s1, s2), desc=None)
        build_s = round(time.process_time() - c0, 1)
        sd = teacher.state_dict()
        matches = sd.keys() == chosen_weights.keys() and all(torch.equal(sd[k], chosen_weights[k]) for k in sd)
        print(f"lab_vlm's teacher at the chosen rates: {build_s} s; matches the pilot's: {matches}", flush=True)

    def record(rec: dict[str, Any], per: dict[float, dict[int, Any]], name: str) -> dict[str, Any]:
        return {"grid": [float(v) for v in rec["grid"]], name: [float(v) for v in rec["scores"]],
                "chosen": float(rec["chosen"]), "at_edge": bool(rec["at_edge"]),
                "by_draw": {f"{lr:g}": {str(d): v for d, v in per[lr].items()} for lr in rec["grid"]}}

    s1_rec = record(rec1, stage1, "score")
    s1_rec["val_patch_loss"] = [-v for v in s1_rec.pop("score")]
    sha, dirty = git_revision(ROOT)  # dirty: code (src/, pyproject.toml) differs from the commit
    out = {
        "rule": "README Deviation 17", "preset": "smoke" if args.smoke else "full", "draws": list(DRAWS),
        "extend": EXTEND, "stage1_lr_before": LabRecipe().stage1_lr,  # the lab's, before Deviation 17
        "stage2_lr_before": LabRecipe().stage2_lr, "stage1": s1_rec,
        "stage2": record(rec2, stage2, "val_mean_exact_match"), "stage1_lr": s1, "stage2_lr": s2,
        "at_edge": bool(rec1["at_edge"] or rec2["at_edge"]), "teacher_steps": base.teacher_steps,
        "stage1_steps": base.stage1_steps, "n_val": base.n_val, "matches_lab_vlm": matches,
        "wall_s": round(time.time() - t0, 1), "git_sha": sha, "src_clean": dirty is False,
    }
    atomic_write_text(out_path, json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("stage1_lr", "stage2_lr", "at_edge", "matches_lab_vlm", "wall_s")}))


if __name__ == "__main__":
    main()
