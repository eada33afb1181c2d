"""PS-PPO: the update pass against full-trajectory GRPO, as ratios in one run.

One batch of 32 sampled rollouts (8 prompts x 4) of 7-term addition chains from the lab's SFT start (the
reproduction's quick preset); each arm runs the reproduction's update pass (``experiment.update_pass``: two PPO
epochs, forward, backward and AdamW step, in token-balanced micro-batches, the code ``PSGRPOTrainer`` runs) on a
fresh copy of the model, interleaved, ``--rounds`` times with fresh stratified cutoff draws; medians. Two
micro-batching schemes: 4 token-balanced micro-batches (``PSGRPOConfig.ps_micro_batches``'s default, marked so in
the rows), and one pass sliced to the batch's longest kept prefix. Laws: stratified uniform, the full + uniform
mixture and the prompt-conditioned law (``AdaptiveCutoff``, fed the batch's rollouts and rewards).
Memory is the activation memory of the update (``ActivationMeter``: bytes autograd saves for backward, each
storage once, parameters excluded), the largest micro-batch's and the sum over micro-batches and epochs. One torch
thread. Writes ``results/ps_ppo/bench.json`` (``icml26.common.bench``; every ratio is a PS-PPO arm over GRPO in the
same run, lower is better), which ``icml26 report`` renders into the paper's README. Run:
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
from icml26.ps_ppo.experiment import PRESETS, lab_model, make_law, observe_groups, update_pass


def trainer_default_micro_batches() -> int:
    """``PSGRPOConfig.ps_micro_batches``'s default (read off the dataclass: no TRL config is built)."""
    from icml26.ps_ppo.trainer import PSGRPOConfig

    return next(f.default for f in dataclasses.fields(PSGRPOConfig) if f.name == "ps_micro_batches")


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
    keys = [i // 4 for i in range(len(prompts))]
    completions = generate(model, tok, prompts, max_new_tokens=cfg.max_new_tokens, temperature=1.0, seed=0)
    batch = completion_batch(tok, prompts, completions)
    lengths = batch["completion_mask"].sum(1).long()
    prompt_share = float(
        ((batch["completion_mask"].cumsum(1) == 0).sum(1)).sum() / batch["attention_mask"].sum()
    )
    advantages = torch.randn(len(prompts), generator=torch.Generator().manual_seed(0))
    rewards = torch.tensor([task.reward(p, c) for p, c in zip(prompts, completions, strict=True)])
    grpo = "GRPO (full trajectories)"
    laws = {
        grpo: make_law("grpo"),
        "PS-PPO uniform, stratified": make_law("ps_ppo"),
        "PS-PPO 0.25 full + 0.75 uniform, stratified": make_law("ps_ppo_mixed"),
        "PS-PPO prompt-conditioned, stratified": make_law("ps_ppo_adaptive"),
    }
    # the prompt-conditioned law reads each prompt's decision point off its group's rollouts, as in training
    observe_groups(laws["PS-PPO prompt-conditioned, stratified"], keys, batch, rewards)
    conditions = (
        f"one batch of {len(prompts)} rollouts (8 prompts x 4) of {cfg.terms}-term addition chains from the "
        f"lab's SFT start, completion length {float(lengths.float().mean()):.1f} tokens on average, prompts "
        f"{100 * prompt_share:.0f} % of the positions; {cfg.ppo_epochs} PPO epochs of forward, backward and "
        "AdamW step on a 0.1 M-parameter character Llama; medians of "
        f"{args.rounds} interleaved rounds with fresh stratified cutoff draws; one torch thread; memory = "
        "bytes autograd saves for backward, each storage once, parameters excluded"
    )
    print(conditions + "\n")
    quantities = (
        ("ms", "update pass time (wall)", "ms"),
        ("cpu", "update pass CPU time", "ms"),
        ("tok", "token positions", "positions"),
        ("peak", "peak activation over micro-batches", "MiB"),
        ("total", "total activation", "MiB"),
    )
    rows = []
    print(
        "| micro-batching | arm | wall ms | vs GRPO | CPU ms | vs GRPO | positions | vs GRPO | peak MiB | vs GRPO | "
        "total MiB | vs GRPO |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    default = trainer_default_micro_batches()
    schemes = [(f"{cfg.micro_batches} token-balanced", cfg.micro_batches), ("one pass", 1)]
    schemes = [
        (f"{name} (PSGRPOConfig default)" if micro == default else name, micro) for name, micro in schemes
    ]
    for scheme, micro in schemes:
        run_cfg = dataclasses.replace(cfg, micro_batches=micro)
        results: dict[str, dict[str, list[float]]] = {
            name: {k: [] for k, _, _ in quantities} for name in laws
        }
        gen = torch.Generator().manual_seed(1)
        for _ in range(args.rounds):
            for name, law in laws.items():
                policy = copy.deepcopy(model)
                opt = torch.optim.AdamW(policy.parameters(), lr=1e-4)
                if law is None:
                    cutoffs, survival = lengths, torch.ones(len(lengths), int(lengths.max()))
                else:
                    cutoffs = law.sample(lengths, gen, keys=keys)
                    survival = law.survival(lengths, int(lengths.max()), keys=keys)
                t0 = time.perf_counter()
                out = update_pass(
                    policy, opt, batch, advantages, cutoffs, survival, cfg=run_cfg, weighted=True
                )
                results[name]["ms"].append(1e3 * (time.perf_counter() - t0))
                results[name]["cpu"].append(1e3 * out["cpu_s"])
                results[name]["tok"].append(out["tokens"])
                results[name]["peak"].append(out["peak_bytes"] / 2**20)
                results[name]["total"].append(out["saved_bytes"] / 2**20)
        base = {k: statistics.median(v) for k, v in results[grpo].items()}
        for name, r in results.items():
            med = {k: statistics.median(v) for k, v in r.items()}
            if name != grpo:
                rows += [
                    bench_row(
                        name,
                        grpo,
                        float(f"{med[key]:.4g}"),
                        float(f"{base[key]:.4g}"),
                        unit=unit,
                        quantity=quantity,
                        micro_batching=scheme,
                    )
                    for key, quantity, unit in quantities
                ]
            print(
                f"| {scheme} | {name} | "
                + " | ".join(f"{med[k]:.4g} | {med[k] / base[k]:.2f}x" for k, _, _ in quantities)
                + " |"
            )
    path = write_bench("ps_ppo", rows, conditions=conditions, out_dir=args.out)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
