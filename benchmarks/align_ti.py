"""Align-TI: TPA's one-pass branch-mask forward against the naive per-branch forwards (time, memory).

On the reproduction's cached teacher (quick preset: 4-layer Llama, width 128, eager attention) and a batch of the
distillation data (multi-token answers), TPA needs the teacher's next-step distribution after each of ``m``
alternatives at every response position ``k``:

1. **naive**: one forward per (k, j) branch over the batch, each on the truncated sequence ``y_<k, y~_kj``
   (``K * m`` forwards);
2. **flattened**: every branch a row of one batch (``B * K * m`` rows of length ``<= k + 1``);
3. **branch mask (ours)**: one forward of ``B`` rows over the sequence plus its ``K * m`` branch tokens, with the
   branch attention mask (``extend_with_branches``); it also yields the sequence's own logits (KD's), which the
   others would need an extra forward for.

The three give the same branch logits (checked). Wall-clock medians of interleaved rounds, one torch thread;
memory is the peak of the CPU allocations torch's profiler records during one call (no gradient). Writes
``results/align_ti/bench.json`` (``icml26.common.bench``). Run: ``.venv/bin/python benchmarks/align_ti.py``.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from icml26.align_ti.experiment import PRESETS, teacher_and_student
from icml26.align_ti.loss import branch_logits, extend_with_branches, propose_alternatives
from icml26.common.bench import bench_row, median_ms, write_bench
from icml26.common.tiny_vlm import SceneSpec, instruction_sampler


def peak_bytes(fn) -> float:
    """Peak of the running sum of the CPU allocations and frees torch's profiler records during ``fn()``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    level = peak = 0
    for e in events:  # allocations at the op that made them (self), frees as "[memory]" events (negative)
        level += e.self_cpu_memory_usage
        peak = max(peak, level)
    return float(peak)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--alternatives", type=int, default=4)
    parser.add_argument("--out", default="results", help="results root (bench.json goes to OUT/align_ti/)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = PRESETS["quick"]
    teacher, student, tok = teacher_and_student(cfg)
    teacher.eval()
    batch = instruction_sampler(tok, SceneSpec(grid=cfg.grid), ("patch",), args.batch)(
        np.random.default_rng(0)
    )
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        plain = student(**inputs).logits
    br = propose_alternatives(
        plain,
        batch["labels"],
        args.alternatives,
        exclude=(tok.convert_tokens_to_ids("<image>"), tok.pad_token_id),
    )
    t_len = batch["input_ids"].shape[1]
    b, k, m = br.tokens.shape
    pixels = batch["pixel_values"]

    @torch.no_grad()
    def one_pass() -> torch.Tensor:
        return branch_logits(teacher(**extend_with_branches(batch, br)).logits, t_len, br)

    @torch.no_grad()
    def naive() -> torch.Tensor:
        out = torch.zeros(b, k, m, plain.shape[-1])
        for r in range(k):
            for j in range(m):
                for row in range(b):  # the rows' response positions differ: one truncated sequence per row
                    if not br.valid[row, r]:
                        continue
                    pos = int(br.positions[row, r])
                    ids = torch.cat([batch["input_ids"][row, :pos], br.tokens[row, r, j : j + 1]])[None]
                    out[row, r, j] = teacher(input_ids=ids, pixel_values=pixels[row : row + 1]).logits[0, -1]
        return out

    @torch.no_grad()
    def flattened() -> torch.Tensor:
        rows, lens, where = [], [], []
        for row in range(b):
            for r in range(k):
                if not br.valid[row, r]:
                    continue
                pos = int(br.positions[row, r])
                for j in range(m):
                    rows.append(torch.cat([batch["input_ids"][row, :pos], br.tokens[row, r, j : j + 1]]))
                    lens.append(pos + 1)
                    where.append((row, r, j))
        width = max(lens)
        ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
        att = torch.zeros((len(rows), width), dtype=torch.long)
        for i, seq in enumerate(rows):
            ids[i, : len(seq)], att[i, : len(seq)] = seq, 1
        logits = teacher(
            input_ids=ids, attention_mask=att, pixel_values=pixels[torch.tensor([w[0] for w in where])]
        ).logits
        out = torch.zeros(b, k, m, plain.shape[-1])
        for i, (row, r, j) in enumerate(where):
            out[row, r, j] = logits[i, lens[i] - 1]
        return out

    ref = one_pass()
    valid = br.valid[..., None, None].expand_as(ref)
    torch.testing.assert_close(naive()[valid], ref[valid], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(flattened()[valid], ref[valid], atol=1e-4, rtol=1e-4)
    n_branches = int(br.valid.sum()) * m
    t_one, t_naive, t_flat = (median_ms(f, args.rounds) for f in (one_pass, naive, flattened))
    mem_one, mem_naive, mem_flat = (peak_bytes(f) / 2**20 for f in (one_pass, naive, flattened))
    print(
        f"{b} rows, sequence {t_len} tokens, {n_branches} branches (m = {m}); medians of {args.rounds} rounds\n"
    )
    print("| forward | ms | peak MiB |")
    print("|---|---|---|")
    for name, t, mem in (
        ("naive, one per branch", t_naive, mem_naive),
        ("flattened batch", t_flat, mem_flat),
        ("branch mask (ours)", t_one, mem_one),
    ):
        print(f"| {name} | {t:.1f} | {mem:.2f} |")
    r4 = lambda x: float(f"{x:.4g}")  # noqa: E731
    ours, base_naive, base_flat = (
        "TPA teacher forward, branch mask, one pass (ours)",
        "naive: one forward per branch",
        "flattened: every branch a row of one batch",
    )
    rows = [
        bench_row(ours, base_naive, r4(t_one), r4(t_naive)),
        bench_row(ours, base_flat, r4(t_one), r4(t_flat)),
        bench_row(ours, base_naive, r4(mem_one), r4(mem_naive), unit="MiB", quantity="peak memory"),
        bench_row(ours, base_flat, r4(mem_one), r4(mem_flat), unit="MiB", quantity="peak memory"),
    ]
    conditions = (
        f"the quick preset's cached teacher (4-layer Llama, width 128, eager attention); {b} 'describe "
        f"patch' questions ({t_len} tokens incl. 4 image tokens), m = {m} student alternatives at each of "
        f"the {k} response positions ({n_branches} branches); no gradient; wall-clock medians of "
        f"{args.rounds} rounds, one torch thread; peak memory from torch's profiler (CPU allocations); "
        "the three give the same branch logits (checked)"
    )
    path = write_bench("align_ti", rows, conditions=conditions, out_dir=args.out)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
