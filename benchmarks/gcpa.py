"""GCPA / GPA / multi-view CCA: fit time against cca-zoo's generalised CCA, as ratios in one run.

M = 5 views, n = 10,000 paired rows, widths 64-128, k = 32 components; each arm is fitted ``--rounds`` times,
interleaved, median reported. Peer: ``cca_zoo.linear.GCCA`` and ``cca_zoo.linear.MCCA`` (cca-zoo 4.x, the
``opt`` extra). Run: ``.venv/bin/python benchmarks/gcpa.py``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from icml26.gcpa import GCPA, GeneralizedProcrustes, MultiviewCCA


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--n", type=int, default=10_000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    threadpool_limits(1)  # one BLAS thread for every arm
    rng = np.random.default_rng(0)
    Z = rng.normal(size=(args.n, 16))
    views = [Z @ rng.normal(size=(16, d)) + 0.5 * rng.normal(size=(args.n, d)) for d in (64, 80, 96, 112, 128)]
    k = 32
    arms = {
        "icml26 GeneralizedProcrustes": lambda: GeneralizedProcrustes(k).fit(views),
        "icml26 GCPA": lambda: GCPA(k).fit(views),
        "icml26 MultiviewCCA maxvar": lambda: MultiviewCCA(k, method="maxvar").fit(views),
        "icml26 MultiviewCCA sumcor": lambda: MultiviewCCA(k, method="sumcor").fit(views),
    }
    try:
        from cca_zoo.linear import GCCA, MCCA

        arms["cca-zoo GCCA"] = lambda: GCCA(n_components=k, shrinkage=0.1).fit(views)
        arms["cca-zoo MCCA"] = lambda: MCCA(n_components=k, shrinkage=0.1).fit(views)
    except ImportError:
        print("cca-zoo is not installed (pip install 'icml26[opt]'): the peer is skipped")
    times: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(args.rounds):
        for name, fit in arms.items():
            t0 = time.perf_counter()
            fit()
            times[name].append(time.perf_counter() - t0)
    peer = statistics.median(times["cca-zoo GCCA"]) if "cca-zoo GCCA" in times else None
    print(f"M = 5, n = {args.n}, widths 64-128, k = {k}, one BLAS/torch thread, median of {args.rounds} fits\n")
    print("| method | fit (s) | vs cca-zoo GCCA |")
    print("|---|---|---|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med:.3f} | {med / peer:.2f}x |" if peer else f"| {name} | {med:.3f} | — |")


if __name__ == "__main__":
    main()
