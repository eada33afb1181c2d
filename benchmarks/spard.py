"""SPARD: time of the relevance-diversity DPP selection (greedy MAP) against the safety pool's size, one run.

For each pool size n (candidates) the selector picks k = floor(0.03 * |D_ft|) items with a fine-tuning set as
large as the pool (|D_ft| = n, so the budget grows with the pool): the incremental-Cholesky greedy
MAP (:func:`icml26.spard.core.greedy_dpp_map`, O(n k^2)) against the naive greedy that recomputes
``det L_{S+i}`` of every candidate at every step (O(n k^4); :func:`icml26.spard.reference.naive_greedy_dpp`,
skipped above ``--naive-max``), on the same kernel, interleaved rounds, medians, one thread. A third row per size
is the whole selector (cosines, relevance, kernel and greedy) against the greedy alone. 768-dim random embeddings
(a 7B model's are 3584-dim; the kernel cost grows with the dimension, the greedy does not).
Writes ``results/spard/bench.json``. Run: ``.venv/bin/python benchmarks/spard.py``.
"""

from __future__ import annotations

import argparse

import numpy as np

from icml26.common.bench import bench_row, median_ms, write_bench
from icml26.common.repro import set_threads
from icml26.spard.core import greedy_dpp_map, relevance_diversity_kernel
from icml26.spard.reference import naive_greedy_dpp
from icml26.spard.selection import RelevanceDiversityDPPSelector


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[300, 1000, 3000])
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--naive-max", type=int, default=1000, help="largest pool timed with the naive greedy")
    parser.add_argument("--out", default="results", help="results root (bench.json goes to OUT/spard/)")
    args = parser.parse_args()
    set_threads(1)
    rng = np.random.default_rng(0)
    rows = []
    for n in args.sizes:
        cand = rng.normal(size=(n, args.dim))
        ref = rng.normal(size=(n, args.dim))
        k = int(0.03 * len(ref))
        L, _ = relevance_diversity_kernel(cand, ref, 4.0)
        fast = median_ms(lambda L=L, k=k: greedy_dpp_map(L, k), args.rounds)
        whole = median_ms(lambda ref=ref, cand=cand: RelevanceDiversityDPPSelector(ratio=0.03).fit(ref).select(cand),
                      args.rounds)
        if n <= args.naive_max:
            naive = median_ms(lambda L=L, k=k: naive_greedy_dpp(L, k), 1)
            assert greedy_dpp_map(L, k).tolist() == naive_greedy_dpp(L, k)
            rows.append(bench_row(f"greedy MAP, incremental Cholesky (pool {n}, k {k})",
                                  "naive greedy recomputing det L_{S+i}", fast, naive, unit="ms", pool=n, k=k))
        rows.append(bench_row(f"whole DPP selection: cosines, relevance, kernel, greedy (pool {n}, k {k})",
                              "the greedy MAP alone", whole, fast, unit="ms", pool=n, k=k))
        print(f"pool {n}, k {k}: greedy {fast:.1f} ms, whole selector {whole:.1f} ms"
              + (f", naive {rows[-2]['baseline_value']:.1f} ms" if n <= args.naive_max else ""))
    conditions = (f"random {args.dim}-dim embeddings, fine-tuning (reference) set as large as the pool, k = floor(0.03 |D_ft|), "
                  f"{args.rounds} rounds (naive: 1), medians, one thread, float64 NumPy; picks checked equal")
    path = write_bench("spard", rows, conditions=conditions, out_dir=args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
