"""Shampoo: time per training step and optimizer-state memory, side by side with AdamW and peer Shampoos.

All arms run in this one process on the digits MLP (64-128-128-10, batch 128, one torch thread), interleaved
round by round so that machine load hits them alike; the figure per arm is the median over rounds. Ratios are
to AdamW. Peers: pytorch-optimizer's ``ScalableShampoo`` (Google's distributed-Shampoo port, Adam-free) and
``SOAP`` (eigenvalue-corrected Shampoo), when the ``opt`` extra is installed. Meta's Distributed Shampoo is not
on the package index and needs Python >= 3.12, so it is not measured here.

Writes ``results/shampoo/bench.json`` (one row per arm and measure, ratio to AdamW measured in the same run; the
README's benchmark table is generated from it by ``icml26 report``).

Run: ``.venv/bin/python benchmarks/shampoo.py [--rounds 7 --steps 100 --out results]``.
Goal (issue #5): at precondition frequency 100, step time within 1.3x AdamW on the digits MLP.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

import torch

from icml26.common.bench import bench_row, write_bench
from icml26.common.repro import set_threads
from icml26.shampoo import Shampoo
from icml26.shampoo.data import digits_mlp_task


def state_bytes(opt: torch.optim.Optimizer) -> int:
    total = 0
    seen: set[int] = set()

    def walk(v):
        nonlocal total
        if isinstance(v, torch.Tensor):
            if v.data_ptr() not in seen:
                seen.add(v.data_ptr())
                total += v.numel() * v.element_size()
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
        elif hasattr(v, "__dict__"):
            walk(vars(v))

    for st in opt.state.values():
        walk(st)
    return total


def arms() -> dict[str, Callable]:
    out: dict[str, Callable] = {
        "torch AdamW": lambda p: torch.optim.AdamW(p, lr=1e-2),
        "icml26 Shampoo freq 10": lambda p: Shampoo(p, lr=1e-2, precondition_frequency=10),
        "icml26 Shampoo freq 100": lambda p: Shampoo(p, lr=1e-2, precondition_frequency=100),
        "icml26 Shampoo left, freq 100": lambda p: Shampoo(p, lr=1e-2, exponents="left", precondition_frequency=100),
    }
    try:
        import pytorch_optimizer as po

        out["pytorch-optimizer ScalableShampoo freq 100"] = lambda p: po.ScalableShampoo(
            p, lr=1e-2, start_preconditioning_step=10, preconditioning_compute_steps=100)
        out["pytorch-optimizer SOAP freq 100"] = lambda p: po.SOAP(p, lr=3e-3, precondition_frequency=100)
    except ImportError:
        print("pytorch-optimizer is not installed (pip install 'icml26[bench]'): peers skipped")
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", default="results", help="results root (bench.json goes to OUT/shampoo/)")
    args = parser.parse_args()
    set_threads(1)
    task = digits_mlp_task(seed=0)
    factories = arms()
    setups = {}
    for name, make in factories.items():
        model = task.make_model(0)
        opt = make(model.parameters())
        setups[name] = (model, opt, torch.Generator().manual_seed(0))

    def steps(name: str, n: int) -> tuple[float, float]:
        model, opt, g = setups[name]
        total = opt_only = 0.0
        for _ in range(n):
            idx = torch.randint(0, task.X.shape[0], (128,), generator=g)
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            task.loss_fn(model(task.X[idx]), task.y[idx]).backward()
            t1 = time.perf_counter()
            opt.step()
            t2 = time.perf_counter()
            total += t2 - t0
            opt_only += t2 - t1
        return 1e3 * total / n, 1e3 * opt_only / n

    for name in setups:  # warm-up past the first roots
        steps(name, 120)
    full: dict[str, list[float]] = {n: [] for n in setups}
    only: dict[str, list[float]] = {n: [] for n in setups}
    for _ in range(args.rounds):
        for name in setups:
            a, b = steps(name, args.steps)
            full[name].append(a)
            only[name].append(b)
    base_full = statistics.median(full["torch AdamW"])
    base_only = statistics.median(only["torch AdamW"])
    base_mem = state_bytes(setups["torch AdamW"][1])
    print(f"digits MLP, batch 128, torch {torch.__version__}, 1 thread, {platform.processor() or platform.machine()}, "
          f"median of {args.rounds} rounds x {args.steps} steps\n")
    print("| optimizer | train step (ms) | vs AdamW | optimizer.step (ms) | vs AdamW | state (KiB) | vs AdamW |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for name in setups:
        f, o, mem = statistics.median(full[name]), statistics.median(only[name]), state_bytes(setups[name][1])
        print(f"| {name} | {f:.3f} | {f / base_full:.2f}x | {o:.3f} | {o / base_only:.2f}x | {mem / 1024:.0f} | "
              f"{mem / base_mem:.2f}x |")
        if name == "torch AdamW":
            continue
        rows += [bench_row(f"{name}: training step", "torch AdamW", round(f, 4), round(base_full, 4), unit="ms"),
                 bench_row(f"{name}: optimizer.step", "torch AdamW", round(o, 4), round(base_only, 4), unit="ms"),
                 bench_row(f"{name}: optimizer state", "torch AdamW", round(mem / 1024, 1), round(base_mem / 1024, 1),
                           unit="KiB", quantity="memory")]
    conditions = (f"digits MLP 64-128-128-10, batch 128, one torch thread, all arms interleaved round by round in "
                  f"one process, median of {args.rounds} rounds x {args.steps} steps after 120 warm-up steps; "
                  "optimizer state counted in bytes of its tensors. Goal of issue #5: a training step within 1.3x "
                  "AdamW's at precondition frequency 100. Meta's Distributed Shampoo is not measured (not on the "
                  "package index; needs Python >= 3.12).")
    path = write_bench("shampoo", rows, conditions=conditions, out_dir=args.out)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
