"""PS-PPO: the update pass against full-trajectory GRPO, as ratios in one run.

One batch of 32 sampled rollouts (8 prompts x 4) of 4-term addition chains from the lab's SFT start; each arm
runs the same update pass (forward, backward, AdamW step) on a fresh copy of the model, interleaved, ``--rounds``
times with fresh cutoff draws; medians. Two micro-batching schemes: bucketed (rows sorted by kept length, 8 per
micro-batch, each sliced to its own longest prefix) and one pass sliced to the batch's longest prefix.
Memory is the activation memory of the update (bytes autograd saves for backward), peak over micro-batches and
total. One torch thread. Writes ``results/ps_ppo/bench.json`` (``icml26.common.bench``; every ratio is a PS-PPO
arm over GRPO in the same run, lower is better), which ``icml26 report`` renders into the paper's README. Run:
``.venv/bin/python benchmarks/ps_ppo.py``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import time

import numpy as np
import torch

from icml26.common.bench import bench_row, write_bench
from icml26.common.tiny_lm import AdditionChain, completion_batch, generate
from icml26.ps_ppo import GeometricCutoff, MixtureCutoff, UniformCutoff
from icml26.ps_ppo.experiment import PRESETS, ActivationMeter, lab_model, left_align, update_pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", default="results", help="results root (bench.json goes to OUT/ps_ppo/)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = PRESETS["quick"]
    model, tok = lab_model(cfg)
    task = AdditionChain(cfg.terms, 9)
    rng = np.random.default_rng(0)
    prompts = [task.sample(rng).prompt for _ in range(8) for _ in range(4)]
    completions = generate(model, tok, prompts, max_new_tokens=cfg.max_new_tokens, temperature=1.0, seed=0)
    batch = completion_batch(tok, prompts, completions)
    lengths = batch["completion_mask"].sum(1).long()
    advantages = torch.randn(len(prompts), generator=torch.Generator().manual_seed(0))
    grpo = "GRPO (full trajectories)"
    laws = {grpo: None, "PS-PPO uniform": UniformCutoff(),
            "PS-PPO 0.5 uniform + 0.5 geometric(1/8)": MixtureCutoff([UniformCutoff(), GeometricCutoff(1 / 8)],
                                                                      [0.5, 0.5])}
    conditions = (f"one batch of {len(prompts)} rollouts (8 prompts x 4) of 4-term addition chains from the lab's SFT "
                  f"start, completion length {float(lengths.float().mean()):.1f} tokens on average; forward, backward "
                  f"and AdamW step on a 0.1 M-parameter character Llama; medians of {args.rounds} interleaved rounds "
                  "with fresh cutoff draws; one torch thread; memory = bytes autograd saves for backward")
    print(conditions + "\n")
    quantities = (("ms", "update pass time (wall)", "ms"), ("tok", "token positions", "positions"),
                  ("peak", "peak activation over micro-batches", "MiB"), ("total", "total activation", "MiB"))
    rows = []
    print("| micro-batching | arm | update pass (ms, wall) | vs GRPO | token positions | vs GRPO | "
          "peak activation (MiB) | vs GRPO | total activation (MiB) | vs GRPO |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for scheme, micro in (("bucketed, 8 rows", 8), ("one pass", len(prompts))):
        run_cfg = dataclasses.replace(cfg, micro_batch=micro)
        results: dict[str, dict[str, list[float]]] = {name: {"ms": [], "tok": [], "peak": [], "total": []} for name in laws}
        gen = torch.Generator().manual_seed(1)
        for _ in range(args.rounds):
            for name, law in laws.items():
                policy = copy.deepcopy(model)
                opt = torch.optim.AdamW(policy.parameters(), lr=1e-4)
                if law is None:
                    cutoffs, survival = lengths, torch.ones(len(lengths), int(lengths.max()))
                else:
                    cutoffs, survival = law.sample(lengths, gen), law.survival(lengths, int(lengths.max()))
                t0 = time.perf_counter()
                tokens, _, peak = update_pass(policy, opt, batch, advantages, cutoffs, survival, cfg=run_cfg,
                                              weighted=True)
                results[name]["ms"].append(1e3 * (time.perf_counter() - t0))
                results[name]["tok"].append(tokens)
                results[name]["peak"].append(peak / 2**20)
                results[name]["total"].append(total_activation(policy, batch, cutoffs, survival, run_cfg) / 2**20)
        base = {k: statistics.median(v) for k, v in results[grpo].items()}
        for name, r in results.items():
            med = {k: statistics.median(v) for k, v in r.items()}
            if name != grpo:
                rows += [bench_row(name, grpo, float(f"{med[key]:.4g}"), float(f"{base[key]:.4g}"), unit=unit,
                                   quantity=quantity, micro_batching=scheme) for key, quantity, unit in quantities]
            print(f"| {scheme} | {name} | {med['ms']:.1f} | {med['ms'] / base['ms']:.2f}x | {med['tok']:.0f} | "
                  f"{med['tok'] / base['tok']:.2f}x | {med['peak']:.2f} | {med['peak'] / base['peak']:.2f}x | "
                  f"{med['total']:.2f} | {med['total'] / base['total']:.2f}x |")
    path = write_bench("ps_ppo", rows, conditions=conditions, out_dir=args.out)
    print(f"\nwrote {path}")


def total_activation(policy, batch, cutoffs, survival, cfg) -> int:
    """Bytes saved for backward summed over the micro-batches of one update pass (no step taken)."""
    from icml26.common.tiny_lm import completion_logps

    comp = batch["completion_mask"]
    keep_len = (comp.cumsum(1) == 0).sum(1) + cutoffs
    order = torch.argsort(keep_len)
    total = 0
    for start in range(0, len(cutoffs), cfg.micro_batch):
        rows = order[start:start + cfg.micro_batch]
        width = int(keep_len[rows].max())
        with ActivationMeter() as meter:
            logps, mask = completion_logps(policy, {k: v[rows, :width] for k, v in batch.items()})
            left_align(logps, mask, survival.shape[1]).sum()
        total += meter.bytes
    return total


if __name__ == "__main__":
    main()
