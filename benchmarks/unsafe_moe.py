"""Unsafe MoE: the cost of route control, and batched F-SOUR candidates against the official one-at-a-time loop.

On the reproduction's aligned tiny Mixtral (quick preset, shallow world, cached), for one held-out harmful
prompt (with the chat template) + target:

1. a plain forward vs the same forward with a ``RouterController`` attached (no rules; and with a route forced
   on every prompt token of every layer), medians of interleaved rounds: the hook overhead;
2. one F-SOUR (token, layer) step with N candidate subsets: N separate forwards (the official loop) vs one
   batched forward of N rows (ours); the two give the same log-probabilities (checked).

One torch thread. Writes ``results/unsafe_moe/bench.json`` (``icml26.common.bench``; each ratio is over its
baseline measured in the same run, lower is better), which ``icml26 report`` renders into the paper's README.
Run: ``.venv/bin/python benchmarks/unsafe_moe.py``.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from icml26.common.bench import bench_row, median_ms, write_bench
from icml26.unsafe_moe import RouterController
from icml26.unsafe_moe.attack import _phi, chat_text, encode, random_subsets, target_logprob
from icml26.unsafe_moe.experiment import EVAL_PREFIXES, HARMFUL, PRESETS, TARGET, aligned_model, prompts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--candidates", type=int, default=10)
    parser.add_argument("--out", default="results", help="results root (bench.json goes to OUT/unsafe_moe/)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tok = aligned_model(PRESETS["quick"], "mixtral", 0, "shallow")
    prompt = prompts(EVAL_PREFIXES, HARMFUL)[0]
    p_ids, t_ids = encode(tok, chat_text(tok, prompt, True)), encode(tok, TARGET)
    n = args.candidates
    print(
        f"prompt {len(p_ids)} tokens + target {len(t_ids)}; {n} candidates; medians of {args.rounds} rounds; "
        "one torch thread\n"
    )

    def forward() -> None:
        target_logprob(model, p_ids, t_ids)

    plain = median_ms(forward, args.rounds)
    with RouterController(model) as rc:
        idle = median_ms(forward, args.rounds)
        rng = np.random.default_rng(0)
        for layer in rc.layers:
            rc.set_phi(layer, _phi(random_subsets(rng, len(p_ids), 8, 2), 8))
        forced = median_ms(forward, args.rounds)
        rc.clear()
        cands = random_subsets(rng, n, 8, 2)

        def one_at_a_time() -> torch.Tensor:
            out = []
            for c in cands:
                rc.force(1, 5, c.tolist())
                out.append(target_logprob(model, p_ids, t_ids)[0])
                rc.clear()
            return torch.stack(out)

        def batched() -> torch.Tensor:
            rc.force(1, 5, cands)
            out = target_logprob(model, p_ids, t_ids, rows=n)
            rc.clear()
            return out

        torch.testing.assert_close(one_at_a_time(), batched(), atol=1e-4, rtol=1e-5)
        sequential, together = median_ms(one_at_a_time, args.rounds), median_ms(batched, args.rounds)
    print("| measurement | ms (wall) | ratio |")
    print("|---|---|---|")
    print(f"| forward, no controller | {plain:.2f} | 1 |")
    print(f"| forward, controller attached, no rules | {idle:.2f} | {idle / plain:.2f} |")
    print(f"| forward, a route forced on every token and layer | {forced:.2f} | {forced / plain:.2f} |")
    print(f"| F-SOUR step, {n} candidates one at a time (official loop) | {sequential:.2f} | 1 |")
    print(
        f"| F-SOUR step, {n} candidates in one batch (ours) | {together:.2f} | {together / sequential:.2f} |"
    )
    plain_name = "forward, no controller"
    r4 = lambda x: float(f"{x:.4g}")  # noqa: E731
    rows = [
        bench_row("forward, controller attached, no rules", plain_name, r4(idle), r4(plain)),
        bench_row("forward, a route forced on every token and layer", plain_name, r4(forced), r4(plain)),
        bench_row(
            f"F-SOUR step, {n} candidates in one batched forward (ours)",
            f"F-SOUR step, {n} candidates one at a time (official loop)",
            r4(together),
            r4(sequential),
        ),
    ]
    conditions = (
        f"the quick preset's aligned tiny Mixtral, shallow world (4 layers, 8 experts, top-2, width 64); one held-out "
        f"harmful prompt ({len(p_ids)} tokens) + target ({len(t_ids)} tokens); wall-clock medians of "
        f"{args.rounds} rounds; one torch thread; the batched and one-at-a-time candidate scores agree "
        "(checked)"
    )
    path = write_bench("unsafe_moe", rows, conditions=conditions, out_dir=args.out)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
