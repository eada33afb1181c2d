"""COCA: what the hook-based interventions cost, against the plain forward and against full fine-tuning.

On the reproduction's pretrained tiny Llama (quick preset, cached), for a batch of alignment examples:

1. a forward with LoReFT (rank 4 at every layer), LoFiT (4 heads) or the LEACE erasure hook attached, against
   the plain forward (the hooks' overhead at inference);
2. one training step of LoReFT (base frozen: gradients flow through the base, only the module's parameters
   are updated) against one step of full fine-tuning (what the intervention replaces);
3. greedy generation of the answers with LoReFT attached against the plain model.

Medians of interleaved rounds, one torch thread. Writes ``results/coca/bench.json`` (``icml26.common.bench``;
each ratio is over its baseline measured in the same run, lower is better), which ``icml26 report`` renders into
the paper's README. Run: ``.venv/bin/python benchmarks/coca.py``.
"""

from __future__ import annotations

import argparse
import copy

import numpy as np
import torch

from icml26.coca.data import World
from icml26.coca.experiment import PRESETS, alignment_data, base_model
from icml26.coca.intervention import ErasureHook, LoFiTIntervention, LoReFTIntervention, decision_states
from icml26.coca.probes import fit_leace
from icml26.common.bench import bench_row, median_ms, write_bench
from icml26.common.tiny_lm import completion_batch, completion_logps, generate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--out", default="results", help="results root (bench.json goes to OUT/coca/)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = PRESETS["quick"]
    base, tok = base_model(cfg)
    world = World(cfg.lab_seed)
    prompts, completions = alignment_data(world, cfg, "coca")
    idx = np.random.default_rng(0).permutation(len(prompts))[: args.batch]
    batch = completion_batch(tok, [prompts[i] for i in idx], [completions[i] for i in idx])
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    print(f"batch {tuple(batch['input_ids'].shape)}; medians of {args.rounds} rounds; one torch thread\n")

    @torch.no_grad()
    def forward() -> None:
        base(**inputs)

    rows = []
    plain = median_ms(forward, args.rounds)
    reft = LoReFTIntervention(base, list(range(cfg.layers)), rank=cfg.rank)
    t_reft = median_ms(forward, args.rounds)
    reft.detach()
    lofit = LoFiTIntervention(base, [(0, 0), (1, 1), (2, 2), (2, 3)])
    t_lofit = median_ms(forward, args.rounds)
    lofit.detach()
    X = decision_states(base, tok, prompts[:400], cfg.probe_layer).double()
    eraser = fit_leace(X.numpy(), np.arange(400) % 2)
    hook = ErasureHook(base, cfg.probe_layer, lambda x: eraser(x.double()), positions="all")
    t_erase = median_ms(forward, args.rounds)
    hook.detach()
    plain2 = median_ms(forward, args.rounds)
    plain = min(plain, plain2)
    rows += [bench_row("forward with LoReFT (rank 4, 3 layers)", "plain forward", t_reft, plain, unit="ms"),
             bench_row("forward with LoFiT (4 heads)", "plain forward", t_lofit, plain, unit="ms"),
             bench_row("forward with LEACE hook (all positions)", "plain forward", t_erase, plain, unit="ms")]

    # training steps: intervention (base frozen) vs full fine-tuning
    with LoReFTIntervention(base, list(range(cfg.layers)), rank=cfg.rank) as module:
        opt = torch.optim.AdamW(module.parameters(), lr=1e-2)

        def reft_step() -> None:
            logps, mask = completion_logps(base, batch)
            loss = -(logps * mask).sum() / mask.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        t_reft_step = median_ms(reft_step, args.rounds)
    ft = copy.deepcopy(base).train()
    for p in ft.parameters():
        p.requires_grad_(True)
    ft_opt = torch.optim.AdamW(ft.parameters(), lr=1e-3)

    def ft_step() -> None:
        logps, mask = completion_logps(ft, batch)
        loss = -(logps * mask).sum() / mask.sum()
        ft_opt.zero_grad(set_to_none=True)
        loss.backward()
        ft_opt.step()

    t_ft_step = median_ms(ft_step, args.rounds)
    rows.append(bench_row("LoReFT training step (base frozen)", "full fine-tuning step", t_reft_step, t_ft_step,
                          unit="ms"))

    gen_prompts = [prompts[i] for i in idx]
    plain_gen = median_ms(lambda: generate(base, tok, gen_prompts, max_new_tokens=cfg.max_new_tokens),
                    max(args.rounds // 4, 3))
    with LoReFTIntervention(base, list(range(cfg.layers)), rank=cfg.rank):
        reft_gen = median_ms(lambda: generate(base, tok, gen_prompts, max_new_tokens=cfg.max_new_tokens),
                       max(args.rounds // 4, 3))
    rows.append(bench_row("greedy generation with LoReFT", "plain generation", reft_gen, plain_gen, unit="ms"))
    for r in rows:
        print(f"{r['name']:45s} {r['method_value']:9.2f} ms  vs {r['baseline']:24s} {r['baseline_value']:9.2f} ms"
              f"  ratio {r['ratio']:.2f}")
    path = write_bench("coca", rows, out_dir=args.out,
                       conditions=f"tiny Llama (3 layers, width 64), batch {tuple(batch['input_ids'].shape)}, "
                                  f"medians of {args.rounds} rounds, one torch thread")
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
