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

Run (a few minutes on one core; writes ``results/spard/utility_pilot.json``)::

    .venv/bin/python scripts/spard_utility_pilot.py
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


def main() -> None:
    torch.set_num_threads(1)
    t0 = time.time()
    cfg = PRESETS["full"]
    world = make_world(cfg.lab_seed)
    tok, _, aligned = lab_models(cfg, world)
    out: dict = {"rule": {"min_clean_sft": MIN_CLEAN, "max_aligned": MAX_ALIGNED, "draws": list(DRAWS),
                          "order": list(CANDIDATES)}, "candidates": {}}
    for name, make in CANDIDATES.items():
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
            print(name, rows[-1], flush=True)
        mean = {k: float(np.mean([r[k] for r in rows])) for k in ("aligned", "clean_sft")}
        out["candidates"][name] = {"draws": rows, "mean": mean,
                                   "qualifies": mean["aligned"] <= MAX_ALIGNED and mean["clean_sft"] >= MIN_CLEAN}
    out["chosen"] = next((n for n, c in out["candidates"].items() if c["qualifies"]), None)
    out["provenance"] = {"git": git_revision(), "wall_s": round(time.time() - t0, 1)}
    atomic_write_text(ROOT / "results" / "spard" / "utility_pilot.json", json.dumps(out, indent=2) + "\n")
    print("chosen:", out["chosen"])


if __name__ == "__main__":
    main()
