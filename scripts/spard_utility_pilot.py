"""SPARD's utility-task pilot (issue #51, mixing's dilution): a user task that needs the fine-tuning.

In the committed results the user's utility task is two-digit addition, which the base already knows from
pretraining: fine-tuning does not need to teach it, so any defence that draws few of the user's samples keeps
"utility" for free. Mixing won that way (README Deviation 14's outcome: at exposure x1024 the user's data is a tiny
share of what the 60 steps draw, and utility does not notice). A world that charges a defence for not learning the
user's task needs a task the aligned model cannot do before fine-tuning and learns within the presets' steps.

**Rule, written before this pilot ran.** Candidates, in this order (both use only characters the tiny LM's
alphabet has and prompts no pretraining or alignment sample has):

- ``comma_sum``: ``"ab,cd="`` -> the sum (a known operation behind a new operator);
- ``difference``: ``"ab-cd="`` with ab >= cd -> the difference (a new operation).

For each candidate, on two tuning draws (seeds far from every evaluated seed) and ``n_utility_val`` validation
items of the candidate (disjoint from the draws' training items), measure the aligned model's accuracy (no
fine-tuning) and the accuracy after plain fine-tuning on the user's task alone (``clean_sft``: the presets'
``n_utility`` items, steps, batch, learning rate and LoRA; no harmful samples, no defence). The world's task is
the first candidate whose mean aligned accuracy is at most 0.2 and whose mean ``clean_sft`` accuracy is at least
0.8; if none qualifies, the world keeps addition and the README says so. Only these two numbers per candidate
decide; no defence, no attack and no ASR is run or read here (choosing the task by how a defence fares would tune
the world to a verdict).

**Stage 1's outcome** (``results/spard/utility_pilot.json``, stage ``steps_60``): no candidate qualified at the
presets' 60 steps (``comma_sum`` reached about half the validation items, ``difference`` almost none), so by the
rule above the world keeps addition at 60 steps.

**Stage 2, written after stage 1's outcome and before stage 2 ran.** The same measurement for ``comma_sum`` alone
(the candidate that learns) at 120 and then 240 fine-tuning steps, every other setting as above. If the aligned
accuracy is at most 0.2 and ``clean_sft`` reaches 0.8 at one of them, the smallest such budget is the one a next
revision may adopt for *every* arm (the steps are shared), stated before its run with its cost in run time; if
neither qualifies, the world keeps addition.

Run (a few minutes on one core; writes ``results/spard/utility_pilot.json``)::

    .venv/bin/python scripts/spard_utility_pilot.py            # stage 1
    .venv/bin/python scripts/spard_utility_pilot.py --stage2   # stage 2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import torch

from icml26.common.io import atomic_write_text
from icml26.common.repro import git_revision
from icml26.common.tiny_lm import generate
from icml26.spard.data import Sample, make_world
from icml26.spard.experiment import PRESETS, Defence, lab_models, train

ROOT = Path(__file__).resolve().parents[1]
DRAWS = (4_000_000, 4_000_001)
MIN_CLEAN, MAX_ALIGNED = 0.8, 0.2


def comma_sum(rng: np.random.Generator, n: int) -> list[Sample]:
    a, b = rng.integers(10, 100, size=n), rng.integers(10, 100, size=n)
    return [Sample(f"{x},{y}=", str(x + y), "utility") for x, y in zip(a.tolist(), b.tolist(), strict=True)]


def difference(rng: np.random.Generator, n: int) -> list[Sample]:
    a, b = rng.integers(10, 100, size=n), rng.integers(10, 100, size=n)
    hi, lo = np.maximum(a, b), np.minimum(a, b)
    return [Sample(f"{x}-{y}=", str(x - y), "utility") for x, y in zip(hi.tolist(), lo.tolist(), strict=True)]


CANDIDATES = {"comma_sum": comma_sum, "difference": difference}


def accuracy(model, tok, items: list[Sample]) -> float:
    responses = generate(model, tok, [s.prompt for s in items], max_new_tokens=5)
    return float(np.mean([r.strip() == s.completion for s, r in zip(items, responses, strict=True)]))


def stage(cfg, tok, aligned, candidates: dict) -> dict:
    """One stage: every candidate in ``candidates`` at ``cfg.steps``, scored by the rule."""
    out: dict = {"steps": cfg.steps, "candidates": {}}
    for name, make in candidates.items():
        rows = []
        for draw in DRAWS:
            rng = np.random.default_rng([draw, 7])
            data = make(rng, cfg.n_utility)
            seen = {s.prompt for s in data}
            val = [s for s in make(np.random.default_rng([draw, 3]), 4 * cfg.n_utility_val)
                   if s.prompt not in seen][:cfg.n_utility_val]
            model, _ = train(dataclasses.replace(cfg), aligned, tok, data, Defence("sft"), draw)
            rows.append({"draw": draw, "aligned": accuracy(aligned, tok, val), "clean_sft": accuracy(model, tok, val),
                         "n_val": len(val)})
            print(cfg.steps, name, rows[-1], flush=True)
        mean = {k: float(np.mean([r[k] for r in rows])) for k in ("aligned", "clean_sft")}
        out["candidates"][name] = {"draws": rows, "mean": mean,
                                   "qualifies": mean["aligned"] <= MAX_ALIGNED and mean["clean_sft"] >= MIN_CLEAN}
    out["chosen"] = next((n for n, c in out["candidates"].items() if c["qualifies"]), None)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage2", action="store_true", help="comma_sum at 120, then 240 steps (stage 2)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    cfg = PRESETS["full"]
    world = make_world(cfg.lab_seed)
    tok, _, aligned = lab_models(cfg, world)
    path = ROOT / "results" / "spard" / "utility_pilot.json"
    out: dict = json.loads(path.read_text()) if args.stage2 else {}
    out["rule"] = {"min_clean_sft": MIN_CLEAN, "max_aligned": MAX_ALIGNED, "draws": list(DRAWS),
                   "order": list(CANDIDATES), "stage2_steps": [120, 240]}
    if not args.stage2:
        out["stages"] = {"steps_60": stage(cfg, tok, aligned, CANDIDATES)}
    else:
        for steps in (120, 240):
            res = stage(dataclasses.replace(cfg, steps=steps), tok, aligned, {"comma_sum": comma_sum})
            out["stages"][f"steps_{steps}"] = res
            if res["chosen"]:
                break
    out["chosen"] = next(({"task": s["chosen"], "steps": s["steps"]} for s in out["stages"].values()
                          if s["chosen"]), None)
    out["provenance"] = {"git": git_revision(), "wall_s": round(time.time() - t0, 1)}
    atomic_write_text(path, json.dumps(out, indent=2) + "\n")
    print("chosen:", out["chosen"])


if __name__ == "__main__":
    main()
