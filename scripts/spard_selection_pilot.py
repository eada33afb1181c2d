"""SPARD's selection-ceiling pilot (issue #51 item 5): in which world settings can *any* selector beat random?

The committed full result has ``oracle_vs_random`` inconclusive: SPAG with the safety budget drawn only from the
attacked dataset's pool (the oracle, the ceiling of any selector) beats random selection by less than the 10
points that ``dpp_vs_random`` asks for. This pilot measures the same gap, on **validation** data only, in a few
settings declared here before it ran, to find a world in which relevance can matter:

- ``base``: the presets' world (attack ``crime_i``, safety budget 3 % of the fine-tuning set);
- ``ratio_1pct`` / ``ratio_0.3pct``: a smaller safety budget (1 % and 0.3 %: 11 and 3 safety examples), where a
  random pick holds few relevant examples;
- ``attack_cyber_q``: the other source and style as the attack.

Each setting trains SPAG (official step, the tuned tau scale of the presets' cached tuning) on the oracle's and on
random safety data, on six tuning draws (seeds far from every evaluated seed), and scores validation ASR (the
lenient judge) on the attacked dataset's validation prompts. The lab models and the tuning come from the cache
(``icml26 reproduce spard`` builds them). Nothing here feeds a result; the output is evidence for the next world
rule, which must be written before it is run.

Run (a few minutes on one core; writes ``results/spard/selection_pilot.json``)::

    .venv/bin/python scripts/spard_selection_pilot.py
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import torch

from icml26.common.io import atomic_write_text
from icml26.common.repro import git_revision
from icml26.spard.data import TieredJudge, make_world
from icml26.spard.experiment import (
    PRESETS,
    Defence,
    finetune_set,
    harmful_outcomes,
    lab_models,
    select_safety,
    train,
    tune,
)

ROOT = Path(__file__).resolve().parents[1]
DRAWS = tuple(3_000_000 + k for k in range(6))
SETTINGS = {"base": {}, "ratio_1pct": {"selection_ratio": 0.01}, "ratio_0.3pct": {"selection_ratio": 0.003},
            "attack_cyber_q": {"attack": "cyber_q"}}


def main() -> None:
    torch.set_num_threads(1)
    t0 = time.time()
    base = PRESETS["full"]
    world = make_world(base.lab_seed)
    tok, pre, aligned = lab_models(base, world)
    hp = tune(base, world, tok, pre, aligned)
    judge = TieredJudge(world)
    rows: dict[str, object] = {}
    for name, change in SETTINGS.items():
        cfg = dataclasses.replace(base, **change)
        val = [s.prompt for s in world.val[cfg.attack]]
        per: dict[str, list[float]] = {"oracle": [], "random": []}
        shares: dict[str, list[float]] = {"oracle": [], "random": []}
        for seed in DRAWS:
            ft = finetune_set(cfg, world, seed)
            for method in ("oracle", "random"):
                safe, info = select_safety(cfg, aligned, tok, world, ft, method, seed)
                model, _ = train(cfg, aligned, tok, ft, Defence("spag", safe, "official", hp["tau_scale"]), seed)
                asr, _, _ = harmful_outcomes(model, tok, judge, val, cfg.max_new_tokens)
                per[method].append(float(np.mean(asr)))
                shares[method].append(info["relevant_share"])
        gap = np.asarray(per["oracle"]) - np.asarray(per["random"])
        rows[name] = {"change": change, "val_asr": per, "relevant_share": shares,
                      "gap_mean": float(gap.mean()), "gap_sd": float(gap.std(ddof=1)),
                      "k": int(np.floor(cfg.selection_ratio * len(ft)))}
        print(f"{name}: oracle - random validation ASR {gap.mean():+.3f} (sd {gap.std(ddof=1):.3f} over "
              f"{len(DRAWS)} draws)", flush=True)
    out = {"script": "scripts/spard_selection_pilot.py", "git": git_revision(ROOT), "draws": list(DRAWS),
           "tau_scale": hp["tau_scale"], "settings": rows, "seconds": round(time.time() - t0, 1),
           "judge": "lenient (score >= 3)"}
    path = ROOT / "results" / "spard" / "selection_pilot.json"
    atomic_write_text(path, json.dumps(out, indent=2, sort_keys=True) + "\n")
    print(path)


if __name__ == "__main__":
    main()
