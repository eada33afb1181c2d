"""Helpers for paper tests: a demo card and experiment, and the smoke run in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from icml26.common.results import SeedRun, validate_result
from icml26.registry import Paper, load_card

DEMO_CARD = """
number = 99
slug = "demo"
title = "A demo paper"
short = "Demo"
venue = "nowhere"
url = "https://example.org"
kind = "estimator"
component = "icml26.demo:Thing"
extras = []
status = "implemented"
summary = "A paper used only by the tests."

[modes.smoke]
seeds = [0]
budget_s = 10
[modes.quick]
seeds = [0, 1, 2]
budget_s = 60
[modes.full]
seeds = [3, 4, 5, 6, 7]
budget_s = 600

[[claims]]
id = "gain"
headline = true
text = "method beats baseline"
metric = "acc"
direction = "higher"
paper = { value = "+5 points", where = "Table 1", scale = "toy" }
check = "method.acc - baseline.acc >= 0.05 over seeds"
min_effect_why = "5 points is the paper's smallest reported gain"

[[claims]]
id = "absolute"
text = "method is accurate"
metric = "acc"
direction = "higher"
paper = { value = "0.9", where = "Figure 2", scale = "toy" }
check = "method.acc >= 0.99 over seeds"
min_effect_why = "the paper's accuracy"
modes = ["quick", "full"]

[[claims]]
id = "items"
text = "method answers more items than baseline"
metric = "correct"
direction = "higher"
paper = { value = "+5 points", where = "Table 1", scale = "toy" }
check = "method.correct - baseline.correct >= 0.05 over items"
min_effect_why = "5 points, as above"

[[claims]]
id = "runs"
kind = "sanity"
text = "the baseline ran"
metric = "acc"
direction = "higher"
paper = { value = "-", where = "-", scale = "-" }
check = "baseline.acc > 0 over seeds"
"""


def write_demo_card(root: Path, text: str = DEMO_CARD) -> Paper:
    """Write a demo card under ``root/src/icml26/demo/`` and return it parsed."""
    folder = root / "src" / "icml26" / "demo"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "paper.toml").write_text(textwrap.dedent(text))
    return load_card(folder / "paper.toml")


@dataclass
class DemoConfig:
    seed: int = 0
    """the seed"""
    gap: float = 0.1
    """how much better the method is"""


def demo_experiment(gap: float = 0.1, *, plot_calls: list | None = None, leak: int = 0) -> types.ModuleType:
    """An experiment module following the contract; its metrics depend only on the seed and ``gap``.

    Each seed tests 80 items of its own (ids ``s<seed>-<i>``) and trains on 40 others; ``leak`` of the test
    items are also among the training items."""
    mod = types.ModuleType("demo_experiment")
    mod.Config = DemoConfig
    mod.PRESETS = {m: DemoConfig(gap=gap) for m in ("smoke", "quick", "full")}

    def run(cfg: DemoConfig) -> SeedRun:
        rng = np.random.default_rng(cfg.seed)
        base = float(rng.uniform(0.5, 0.8))
        baseline_correct = (rng.random(80) < base).astype(float)
        method_correct = np.maximum(baseline_correct, (rng.random(80) < 2 * cfg.gap).astype(float))
        return SeedRun({"method": {"acc": base + cfg.gap}, "baseline": {"acc": base}},
                       notes={"absolute": "a toy cannot reach 0.99"},
                       units={"items": {"method": {"correct": method_correct.tolist()},
                                        "baseline": {"correct": baseline_correct.tolist()}}},
                       unit_ids={"items": [f"s{cfg.seed}-{i}" for i in range(80)]},
                       held_out={"items": {"train": [f"s{cfg.seed}-{i}" for i in range(80 - leak, 120 - leak)],
                                           "validation": []}})

    mod.run = run
    if plot_calls is not None:
        mod.plot = lambda runs, result, out_dir: plot_calls.append((len(runs), result["mode"], out_dir))
    return mod


def reproduce_in_subprocess(slug: str, out_dir: Path, mode: str = "smoke", seeds: str | None = None,
                            timeout: float = 600) -> dict[str, Any]:
    """Run ``icml26 reproduce SLUG --mode MODE`` in a fresh interpreter; return the validated result JSON."""
    cmd = [sys.executable, "-m", "icml26", "reproduce", slug, "--mode", mode, "--out", str(out_dir)]
    if seeds is not None:
        cmd += ["--seeds", seeds]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "ICML26_PROGRESS": "0"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"reproduce failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    data = json.loads((out_dir / slug / f"{mode}.json").read_text())
    validate_result(data)
    return data


def assert_matches_committed(data: dict[str, Any], *, atol: float, rtol: float = 0.0,
                             metrics: dict[str, float] | None = None, root: Path | None = None) -> None:
    """A fresh result agrees with the committed ``results/<slug>/<mode>.json``: verdicts, and every arm's mean
    within ``atol + rtol * |committed|`` (``metrics`` overrides ``atol`` for ``"arm.metric"`` keys).

    State the tolerance where it is used, and why (what varies across CPUs: BLAS summation order in float32
    training, thread timing in wall-clock metrics). Use ``atol=0`` for what must be bit-identical.
    """
    root = root or Path(__file__).resolve().parents[1]
    committed = json.loads((root / "results" / data["slug"] / f"{data['mode']}.json").read_text())
    assert data["seeds"] == committed["seeds"]
    assert {c["id"]: c["verdict"] for c in data["claims"]} == {c["id"]: c["verdict"] for c in committed["claims"]}
    metrics = metrics or {}
    off = []
    for arm, ms in committed["arms"].items():
        for name, stat in ms.items():
            tol = metrics.get(f"{arm}.{name}", atol) + rtol * abs(stat["mean"])
            new = data["arms"][arm][name]["mean"]
            if not (abs(new - stat["mean"]) <= tol or (np.isnan(new) and np.isnan(stat["mean"]))):
                off.append(f"{arm}.{name}: {new} vs committed {stat['mean']} (tolerance {tol:g})")
    assert not off, "values moved beyond tolerance:\n" + "\n".join(off)
